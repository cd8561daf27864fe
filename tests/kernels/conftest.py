"""Run the Triton kernels on CPU tensors: TRITON_INTERPRET must be set before triton is imported.

Triton decides at `@triton.jit` time whether a kernel is compiled or interpreted, so this file
sets the variable at import, before any test module imports `kernels.*`.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # `kernels` and `engine` importable without an editable install
    sys.path.insert(0, _ROOT)
