"""What both KV allocators share: the interface the scheduler calls and the block map view.

The allocator owns which physical blocks each request may write; the request keeps its
`block_table` (logical block i -> physical block). The map the app draws is derived from
those tables each step, never kept in sync by hand.
"""

from __future__ import annotations

from typing import TypedDict

from engine.request import Request
from engine.waits import Wait


class BlockView(TypedDict):
    """One physical block as the app draws it (a plain dict: StepReport's KV map holds these
    as they are, with no object to convert per block)."""

    block: int
    state: str  # "free", "used", "reserved" (reserved, not yet written), "shared", "cached"
    owners: list[str]  # request ids whose block table holds it
    tokens: int  # slots holding real tokens (0..block_size)


class BlockAllocator:
    layout = "?"

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.last_wait: Wait | None = None  # why the last admit() refused, as a code

    # --- the scheduler's calls -------------------------------------------------------------
    def admit(self, req: Request) -> bool:
        """Called when a request takes a seat. False: it cannot start now (it keeps waiting)."""
        raise NotImplementedError

    def ensure_slots(self, req: Request, num_tokens: int) -> bool:
        """Give req slots for its first num_tokens tokens; all or nothing."""
        raise NotImplementedError

    def free(self, req: Request) -> None:
        """Release everything req holds (finished or preempted)."""
        raise NotImplementedError

    def truncate(self, req: Request, num_tokens: int) -> None:
        """Roll back to num_tokens slots (rejected draft tokens); paged frees emptied blocks."""

    def on_computed(self, req: Request) -> None:
        """req.num_computed_tokens advanced (the prefix cache registers full blocks)."""

    def fork(self, parent: Request, child: Request) -> None:
        """Parallel sampling: child holds parent's blocks too (paged: by reference)."""
        raise NotImplementedError(f"{self.layout} KV cannot share blocks between requests")

    def take_copies(self) -> list[tuple[int, int]]:
        """(source, destination) blocks whose KV must be copied before the next forward
        (paged copy-on-write); each call hands them over once."""
        return []

    # --- views ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        raise NotImplementedError

    def is_free(self, block: int) -> bool:
        raise NotImplementedError

    def largest_free_run(self) -> int:
        """The longest run of consecutive free blocks (external fragmentation shows here)."""
        raise NotImplementedError

    def slot(self, req: Request, pos: int) -> int:
        return req.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def block_map(self, running: list[Request]) -> list[BlockView]:
        """Every block that is not free, in block order: held by a request (used, reserved or
        shared) or kept for the prefix cache. A block not listed is free. Built from the
        requests' block tables, at a cost proportional to the blocks in use, whatever the
        size of the pool (a step of 256 requests holding 2,000 blocks builds it every step,
        so the loop below does the least per block: one division per request, not two
        comparisons per block)."""
        bs = self.block_size
        views: dict[int, BlockView] = {}
        get = views.get
        for req in running:
            rid = req.request_id
            table = req.block_table
            full, part = divmod(req.num_computed_tokens, bs)  # written: full blocks, then part
            for i, b in enumerate(table):
                tokens = bs if i < full else part if i == full else 0
                v = get(b)
                if v is None:
                    views[b] = {"block": b, "state": "used" if tokens else "reserved",
                                "owners": [rid], "tokens": tokens}
                else:  # a prefix block more than one request holds
                    v["owners"].append(rid)
                    v["state"] = "shared"
                    if tokens > v["tokens"]:
                        v["tokens"] = tokens
        for b in self.cached_blocks():
            if b not in views:
                views[b] = {"block": b, "state": "cached", "owners": [], "tokens": 0}
        return [views[b] for b in sorted(views)]

    def cached_blocks(self):
        """Blocks no request holds whose content is kept for reuse (paged prefix cache)."""
        return ()


def largest_gap(held: list[int], num_blocks: int) -> int:
    """The longest run of blocks not in `held` (sorted block ids) within 0..num_blocks-1."""
    best, prev = 0, -1
    for b in held:
        best = max(best, b - prev - 1)
        prev = b
    return max(best, num_blocks - prev - 1)
