"""`python -m kernels.bench` is now `python -m kernels.gpu_check` (same arguments).

The kernel timings, the copy bandwidth and the correctness checks that lived here moved into
kernels/gpu_check.py, which also checks and times the engine on the GPU; this name stays so
older notes and commands keep working.
"""

import sys

from kernels.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
