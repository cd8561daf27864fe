"""Triton kernels for ServeLab's GPU path: paged attention over the engine's KV pool, and the
fused small ops of a layer.

The code lives in the top-level folder `kernels/`; this package is its import name, and stays
one because the name clash stays: transformers requires PyPI's `kernels` package (`pip show
kernels`: Required-by: transformers) and imports it while it reads a GGUF file. The folder has
no `__init__.py` of its own, so `import kernels` never finds it ahead of PyPI's (a regular
package always wins over a folder without one). `__path__` below makes
`servelab_kernels.<module>` load `kernels/<module>.py`, the same from the repo root, from an
editable install and from a copy of the tree.

Each kernel file holds its kernels next to the plain torch reference they are tested against:

  * `store_kv.py`          write this step's K/V into the pool at `slot_mapping` (PagedAttention,
                           Kwon et al., vLLM 2023: the "reshape_and_cache" step)
  * `decode_attention.py`  one query token per request, split over the context
                           (flash-decoding, Dao et al. 2023) and a combine step
  * `extend_attention.py`  several query tokens per request (prefill chunks, speculative
                           verification) attending causally through the block table
  * `fused_ops.py`         RMSNorm (with the residual add), RoPE and SwiGLU, one kernel each
  * `warmup.py`            every kernel variant a serving step can launch, compiled at start-up
  * `_common.py`           what they share: input checks, interpreter detection, the tiles
                           of paged attention that decode and extend both use

These modules import torch, triton and each other, nothing of the project
(tests/test_layers.py). The engine's adapters import them, only when the Triton backend or the
fused ops are asked for: `engine/model/attention/triton_backend.py` and
`engine.model.llama.triton_ops`. The GPU check that runs and times them on a GPU is
`python -m benchmarks.gpu.check --out DIR`.

Set TRITON_INTERPRET=1 before triton is imported to run the kernels on CPU tensors.
This package imports nothing at load time, so the engine runs without triton installed.
"""

import os

__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")]
