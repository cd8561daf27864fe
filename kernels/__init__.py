"""Triton kernels for ServeLab's GPU path: paged attention over the engine's KV pool.

Each file holds one kernel next to the plain torch reference it is tested against:

  * `store_kv.py`          write this step's K/V into the pool at `slot_mapping` (PagedAttention,
                           Kwon et al., vLLM 2023: the "reshape_and_cache" step)
  * `decode_attention.py`  one query token per request, split over the context
                           (flash-decoding, Dao et al. 2023) and a combine step
  * `extend_attention.py`  several query tokens per request (prefill chunks, speculative
                           verification) attending causally through the block table
  * `backend.py`           `TritonAttention`, the engine backend built from the three
  * `bench.py`             `python -m kernels.bench --out DIR` (CUDA only)

Set TRITON_INTERPRET=1 before triton is imported to run the kernels on CPU tensors.
This package imports nothing at load time, so the engine runs without triton installed.
"""
