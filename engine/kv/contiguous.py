"""Contiguous KV reservation: the "banquet hall" of chapter 6.4, leak 2.

A naive server does not know how long an answer will be, so at admission each request
reserves one contiguous run of blocks big enough for `max_model_len` tokens, first fit.
Most of the run stays reserved but unused (internal waste), and as runs of different ages
come and go the free space is chopped up: the free total may fit a request while no single
run does (external fragmentation), and then the request waits.
"""

from __future__ import annotations

from engine.kv.allocator import BlockAllocator
from engine.request import Request


class ContiguousAllocator(BlockAllocator):
    layout = "contiguous"

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int):
        super().__init__(num_blocks, block_size)
        self.run_len = -(-max_model_len // block_size)  # blocks reserved per request
        self.owner: list[str | None] = [None] * num_blocks
        self.last_refusal: str | None = None  # why the last admit failed, for the report

    @property
    def num_free_blocks(self) -> int:
        return sum(o is None for o in self.owner)

    def is_free(self, block: int) -> bool:
        return self.owner[block] is None

    def first_fit(self, n: int) -> int | None:
        run = 0
        for b in range(self.num_blocks):
            run = run + 1 if self.owner[b] is None else 0
            if run == n:
                return b - n + 1
        return None

    def admit(self, req: Request) -> bool:
        assert not req.block_table, f"{req.request_id} admitted twice"
        start = self.first_fit(self.run_len)
        if start is None:
            free = self.num_free_blocks
            if free >= self.run_len:
                self.last_refusal = (
                    f"external fragmentation: {free} blocks free in total, but the largest "
                    f"free run is {self.largest_free_run()} and {req.request_id} needs "
                    f"{self.run_len} in a row")
            else:
                self.last_refusal = (f"KV full: {free} blocks free, {req.request_id} needs "
                                     f"{self.run_len}")
            return False
        for b in range(start, start + self.run_len):
            self.owner[b] = req.request_id
        req.block_table = list(range(start, start + self.run_len))
        self.last_refusal = None
        return True

    def ensure_slots(self, req: Request, num_tokens: int) -> bool:
        # the whole hall was reserved at admission
        return num_tokens <= len(req.block_table) * self.block_size

    def free(self, req: Request) -> None:
        for b in req.block_table:
            assert self.owner[b] == req.request_id, f"block {b} not owned by {req.request_id}"
            self.owner[b] = None
        req.block_table = []
