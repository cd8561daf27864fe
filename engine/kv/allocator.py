"""What both KV allocators share: the interface the scheduler calls and the block map view.

The allocator owns which physical blocks each request may write; the request keeps its
`block_table` (logical block i -> physical block). The map the app draws is derived from
those tables each step, never kept in sync by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import Request


@dataclass
class BlockView:
    """One physical block as the app draws it."""

    block: int
    state: str  # "free", "used", "reserved" (reserved, not yet written), "shared", "cached"
    owners: list[str]  # request ids whose block table holds it
    tokens: int  # slots holding real tokens (0..block_size)


class BlockAllocator:
    layout = "?"

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size

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

    # --- views ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        raise NotImplementedError

    def is_free(self, block: int) -> bool:
        raise NotImplementedError

    def largest_free_run(self) -> int:
        """The longest run of consecutive free blocks (external fragmentation shows here)."""
        best = run = 0
        for b in range(self.num_blocks):
            run = run + 1 if self.is_free(b) else 0
            best = max(best, run)
        return best

    def slot(self, req: Request, pos: int) -> int:
        return req.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def block_map(self, running: list[Request]) -> list[BlockView]:
        bs = self.block_size
        views = [BlockView(b, "free", [], 0) for b in range(self.num_blocks)]
        for req in running:
            written = req.num_computed_tokens
            for i, b in enumerate(req.block_table):
                v = views[b]
                v.owners.append(req.request_id)
                v.tokens = max(v.tokens, min(bs, max(0, written - i * bs)))
        for v in views:
            if len(v.owners) > 1:
                v.state = "shared"
            elif v.owners:
                v.state = "used" if v.tokens > 0 else "reserved"
            elif not self.is_free(v.block):
                v.state = "cached"  # paged prefix cache: no owner, content kept for reuse
        return views
