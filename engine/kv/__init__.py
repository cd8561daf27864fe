"""The KV cache: the pool tensors and the two allocators that hand out its blocks."""

from engine.kv.contiguous import ContiguousAllocator
from engine.kv.paged import PagedAllocator
from engine.kv.pool import KVPool

__all__ = ["KVPool", "PagedAllocator", "ContiguousAllocator"]
