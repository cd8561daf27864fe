"""Contiguous KV reservation: the "banquet hall" of chapter 6.4, leak 2.

A server without paging does not know how long an answer will be, so at admission each
request reserves one contiguous run of blocks for the longest it may grow: its prompt plus
its own `max_tokens`, capped at `max_model_len` (Orca's reservation; FasterTransformer and
early servers reserved the same). First fit places the run. Most of it stays reserved but
unused (internal waste), and since runs differ in size and leave at different times, the
free space is chopped into holes: the free total may fit a request while no single hole does
(external fragmentation), and then the request waits at the door.

The allocator keeps the reserved runs sorted by their first block, so placing a run, counting
free blocks and finding the largest hole cost time in proportion to the requests holding
runs, not to the size of the pool.
"""

from __future__ import annotations

import bisect

from engine.kv.allocator import BlockAllocator
from engine.request import Request
from engine.waits import Wait


class ContiguousAllocator(BlockAllocator):
    layout = "contiguous"

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int):
        super().__init__(num_blocks, block_size)
        self.max_model_len = max_model_len
        self.starts: list[int] = []  # first block of each reserved run, sorted
        self.runs: dict[int, tuple[int, str]] = {}  # first block -> (length, request id)
        self._free = num_blocks
        self.last_refusal: str | None = None  # why the last admit failed, for the report

    def run_len(self, req: Request) -> int:
        """Blocks reserved for req: its prompt plus its max_tokens, capped at max_model_len."""
        tokens = min(req.num_prompt_tokens + req.sampling.max_tokens, self.max_model_len)
        return -(-tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return self._free

    def is_free(self, block: int) -> bool:
        i = bisect.bisect_right(self.starts, block) - 1
        return i < 0 or block >= self.starts[i] + self.runs[self.starts[i]][0]

    def holes(self):
        """(first block, length) of every run of free blocks, in block order."""
        prev_end = 0
        for s in self.starts:
            if s > prev_end:
                yield prev_end, s - prev_end
            prev_end = s + self.runs[s][0]
        if prev_end < self.num_blocks:
            yield prev_end, self.num_blocks - prev_end

    def largest_free_run(self) -> int:
        return max((n for _, n in self.holes()), default=0)

    def first_fit(self, n: int) -> int | None:
        return next((start for start, size in self.holes() if size >= n), None)

    def admit(self, req: Request) -> bool:
        assert not req.block_table, f"{req.request_id} admitted twice"
        n = self.run_len(req)
        start = self.first_fit(n)
        if start is None:
            free, largest = self.num_free_blocks, self.largest_free_run()
            if free >= n:
                self.last_refusal = (
                    f"external fragmentation: {free} blocks free in total, but the largest "
                    f"free run is {largest} and {req.request_id} needs {n} in a row")
                self.last_wait = Wait("kv_fragmented", {"needed": n, "free": free,
                                                        "largest_free_run": largest})
            else:
                self.last_refusal = f"KV full: {free} blocks free, {req.request_id} needs {n}"
                self.last_wait = Wait("kv_short", {"needed": n, "free": free})
            return False
        bisect.insort(self.starts, start)
        self.runs[start] = (n, req.request_id)
        self._free -= n
        req.block_table = list(range(start, start + n))
        self.last_refusal = None
        return True

    def ensure_slots(self, req: Request, num_tokens: int) -> bool:
        # the whole hall was reserved at admission
        return num_tokens <= len(req.block_table) * self.block_size

    def free(self, req: Request) -> None:
        if not req.block_table:
            return
        start = req.block_table[0]
        n, owner = self.runs.pop(start)
        assert owner == req.request_id and n == len(req.block_table), (
            f"blocks {start}..{start + n - 1} are not {req.request_id}'s run")
        self.starts.remove(start)
        self._free += n
        req.block_table = []
