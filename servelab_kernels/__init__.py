"""Triton kernels for ServeLab's GPU path: paged attention over the engine's KV pool.

The code lives in the top-level folder `kernels/`; this package is its import name. The folder
has no `__init__.py` of its own, so `import kernels` never finds it ahead of PyPI's `kernels`
(a regular package always wins over a folder without one), which transformers imports while
it reads a GGUF file. `__path__` below makes `servelab_kernels.<module>` load
`kernels/<module>.py`, the same from the repo root (`python -m servelab_kernels.gpu_check`),
from an editable install and from a copy of the tree.

Each file holds one kernel next to the plain torch reference it is tested against:

  * `store_kv.py`          write this step's K/V into the pool at `slot_mapping` (PagedAttention,
                           Kwon et al., vLLM 2023: the "reshape_and_cache" step)
  * `decode_attention.py`  one query token per request, split over the context
                           (flash-decoding, Dao et al. 2023) and a combine step
  * `extend_attention.py`  several query tokens per request (prefill chunks, speculative
                           verification) attending causally through the block table
  * `fused_ops.py`         RMSNorm (with the residual add), RoPE and SwiGLU, one kernel each
  * `warmup.py`            every kernel variant a serving step can launch, compiled at start-up
  * `gpu_check.py`         `python -m servelab_kernels.gpu_check --out DIR` (CUDA only): the
                           kernels and the engine checked and timed on a GPU in one run

Set TRITON_INTERPRET=1 before triton is imported to run the kernels on CPU tensors.
These modules import torch, triton and each other, nothing of the engine: the engine's
adapters import them (`engine/model/attention/triton_backend.py`, `engine.model.llama.triton_ops`),
only when the Triton backend or the fused ops are asked for. This package imports nothing at
load time, so the engine runs without triton installed.
"""

import os

__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")]
