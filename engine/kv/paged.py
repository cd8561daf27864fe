"""Paged KV allocation (PagedAttention, Kwon et al., SOSP 2023; chapter 6.4, leak 2).

Blocks of `block_size` slots are handed out one at a time as a request's tokens arrive, so a
request never holds more than one partly-filled block. Blocks carry a reference count so
several requests can share one: the n samples of one prompt (parallel sampling: the samples
hold the prompt's blocks by reference, and a sample about to write into a block it shares
first gets its own copy of it: copy-on-write, so only the last, partial prompt block is ever
copied), and prefix caching: each full block's hash chains the previous
block's hash with this block's token ids, as in nano-vllm and vLLM. A cached block whose
count drops to zero keeps its content and is reused least-recently-used first.

The key is SHA-256 over the parent's key and the block's token ids as bytes (vLLM's default
since it served many tenants), not Python's `hash()`: that one is predictable for integers
and tuples, so a client could craft a prompt whose key equals another's and be handed that
request's cached KV (on a class server: one student reading another's context). A
collision of SHA-256 is not something a prompt can be made to have.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

from engine.kv.allocator import BlockAllocator, largest_gap
from engine.request import Request

_ROOT = bytes(32)  # the parent key of a prompt's first block
EVICTED_KEPT = 4  # evicted keys remembered, per block of the pool, to explain a miss


def block_hash(prev: bytes | None, tokens: list[int]) -> bytes:
    """The content key of a full block: SHA-256(parent key, token ids as 8-byte integers).
    The parent key has a fixed length, so no two (parent, tokens) pairs share an input."""
    return hashlib.sha256((prev or _ROOT) + array("q", tokens).tobytes()).digest()


class PagedAllocator(BlockAllocator):
    layout = "paged"

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        super().__init__(num_blocks, block_size)
        self.prefix_caching = enable_prefix_caching
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_count = [0] * num_blocks
        self.held: set[int] = set()  # blocks with ref_count > 0
        self.hash_of: dict[int, bytes] = {}  # block -> content hash (full, computed blocks only)
        self.cached: dict[bytes, int] = {}  # content hash -> block
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, cached; LRU order
        self.hashed_upto: dict[str, int] = {}  # request id -> number of its blocks hashed
        self.prefix_queries = 0  # prompt blocks looked up
        self.prefix_hits = 0  # of which found in the cache
        self.copies: list[tuple[int, int]] = []  # copy-on-write: (source, destination) blocks
        # for explaining a lookup's first miss: each cached key's tokens and its parent's
        # children, and the keys evicted lately (at most EVICTED_KEPT of them)
        self.tokens_of: dict[bytes, tuple[int, ...]] = {}
        self.parent_of: dict[bytes, bytes] = {}
        self.children: dict[bytes, set[bytes]] = {}
        self.evicted: OrderedDict[bytes, None] = OrderedDict()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.evictable)

    def is_free(self, block: int) -> bool:
        return self.ref_count[block] == 0

    def largest_free_run(self) -> int:
        return largest_gap(sorted(self.held), self.num_blocks)

    def cached_blocks(self):
        return self.evictable.keys()

    def _take(self) -> int:
        if self.free_blocks:
            b = self.free_blocks.popleft()
        else:  # reuse the least recently used cached block; forget its content
            b, _ = self.evictable.popitem(last=False)
            h = self.hash_of.pop(b)
            del self.cached[h]
            self._forget(h)
        assert self.ref_count[b] == 0, f"block {b} handed out twice"
        self.ref_count[b] = 1
        self.held.add(b)
        return b

    def _release(self, b: int) -> None:
        assert self.ref_count[b] > 0, f"block {b} freed twice"
        self.ref_count[b] -= 1
        if self.ref_count[b] == 0:
            self.held.discard(b)
            if self.copies:  # a copy into a block given back is moot
                self.copies = [c for c in self.copies if c[1] != b]
            if b in self.hash_of:
                self.evictable[b] = None  # keep the content; most recently used last
            else:
                self.free_blocks.append(b)

    def admit(self, req: Request) -> bool:
        assert not req.block_table, f"{req.request_id} admitted twice"
        # prompt log-probabilities need every prompt position computed: no cache hits
        if (self.prefix_caching and req.num_computed_tokens == 0
                and req.sampling.prompt_logprobs is None):
            self._match_prefix(req)
        self.hashed_upto[req.request_id] = len(req.block_table)
        return True

    def _match_prefix(self, req: Request) -> None:
        """Reuse cached blocks for the longest run of full prompt blocks already computed, and
        say why the run stopped where it did (`req.prefix_lookup`: `_explain_miss`)."""
        tokens, bs = req.all_token_ids, self.block_size
        # at least one token must still be computed, to produce the next token's logits
        max_blocks = (len(tokens) - 1) // bs
        prev = None
        miss = None
        for i in range(max_blocks):
            h = block_hash(prev, tokens[i * bs:(i + 1) * bs])
            self.prefix_queries += 1
            b = self.cached.get(h)
            if b is None:
                self.prefix_queries += max_blocks - i - 1
                miss = self._explain_miss(prev, h, tokens, i)
                break
            self.prefix_hits += 1
            if self.ref_count[b] == 0:
                del self.evictable[b]
                self.held.add(b)
            self.ref_count[b] += 1
            req.block_table.append(b)
            prev = h
        req.num_computed_tokens = len(req.block_table) * bs
        req.num_cached_tokens = req.num_computed_tokens
        if miss is None:  # every full block hit: what is left is shorter than a block
            miss = {"why": "short", "token": max_blocks * bs,
                    "left": len(tokens) - max_blocks * bs}
        req.prefix_lookup = {"hit_blocks": len(req.block_table), "full_blocks": max_blocks,
                             "miss": miss}

    def _explain_miss(self, prev: bytes | None, h: bytes, tokens: list[int], i: int) -> dict:
        """Why prompt block i was not in the cache: "evicted" (it was, lately, and its block
        went to another request), "differs" (a cached block follows the same prefix and
        differs at `token`, the prompt's position of the first token that is not its), or
        "new" (nothing computed so far follows this prefix)."""
        bs = self.block_size
        if h in self.evicted:
            return {"why": "evicted", "token": i * bs}
        block = tokens[i * bs:(i + 1) * bs]
        best = -1
        for child in self.children.get(prev or _ROOT, ()):
            theirs = self.tokens_of[child]
            same = next((j for j, (a, b) in enumerate(zip(block, theirs)) if a != b), bs)
            best = max(best, same)
        if best >= 0:
            return {"why": "differs", "token": i * bs + best}
        return {"why": "new", "token": i * bs}

    def _forget(self, h: bytes) -> None:
        """A key's block is reused for other content: its explanation data goes, and the
        key is remembered as evicted."""
        self.tokens_of.pop(h, None)
        parent = self.parent_of.pop(h, None)
        if parent is not None:
            kids = self.children[parent]
            kids.discard(h)
            if not kids:
                del self.children[parent]
        self.evicted[h] = None
        while len(self.evicted) > EVICTED_KEPT * self.num_blocks:
            self.evicted.popitem(last=False)

    def ensure_slots(self, req: Request, num_tokens: int) -> bool:
        bs, table = self.block_size, req.block_table
        need = max(0, -(-num_tokens // bs) - len(table))
        # blocks this step writes into that another request also holds: copy-on-write
        shared = [i for i in range(req.num_computed_tokens // bs, min(len(table),
                                                                      -(-num_tokens // bs)))
                  if self.ref_count[table[i]] > 1]
        if need + len(shared) == 0:
            return True
        if need + len(shared) > self.num_free_blocks:
            return False
        for i in shared:
            old, new = table[i], self._take()
            self.copies.append((old, new))
            self._release(old)
            table[i] = new
        table.extend(self._take() for _ in range(need))
        return True

    def fork(self, parent: Request, child: Request) -> None:
        assert not child.block_table, f"{child.request_id} already holds blocks"
        child.block_table = list(parent.block_table)
        for b in child.block_table:
            self.ref_count[b] += 1
        self.hashed_upto[child.request_id] = self.hashed_upto.get(parent.request_id, 0)

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def free(self, req: Request) -> None:
        # release in reverse so a request's later (less shared) blocks are evicted first
        for b in reversed(req.block_table):
            self._release(b)
        req.block_table = []
        self.hashed_upto.pop(req.request_id, None)

    def truncate(self, req: Request, num_tokens: int) -> None:
        keep = -(-num_tokens // self.block_size)
        while len(req.block_table) > keep:
            self._release(req.block_table.pop())

    def on_computed(self, req: Request) -> None:
        if not self.prefix_caching:
            return
        bs, tokens = self.block_size, req.all_token_ids
        done = self.hashed_upto.get(req.request_id, 0)
        full = min(req.num_computed_tokens // bs, len(req.block_table))
        for i in range(done, full):
            prev = self.hash_of.get(req.block_table[i - 1]) if i > 0 else None
            h = block_hash(prev, tokens[i * bs:(i + 1) * bs])
            b = req.block_table[i]
            if h not in self.cached and b not in self.hash_of:
                self.cached[h] = b
                self.hash_of[b] = h
                self.tokens_of[h] = tuple(tokens[i * bs:(i + 1) * bs])
                self.parent_of[h] = prev or _ROOT
                self.children.setdefault(prev or _ROOT, set()).add(h)
                self.evicted.pop(h, None)
        self.hashed_upto[req.request_id] = max(done, full)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
