"""Paged attention's interface: the per-step metadata every backend reads, and the backend ABC.

"Paged" lives entirely in two arrays (the nano-vllm framing):
  * `slot_mapping[t]`  where token t's new K/V is written (block * block_size + offset; -1 = skip)
  * `block_tables[s]`  which physical blocks hold sequence s's context, in logical order
Both KV layouts (contiguous and paged) fill these same arrays, so there is one attention path.

Pool layout, per layer:  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A backend (`AttentionBackend`, registered by name in this package's `__init__`, as
mini-sglang's attention backends are) has two methods: `store_kv` writes this step's K/V into
the pool, `forward` lets each query token attend causally to its sequence's cached context,
which already includes the tokens written this step.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    """One flat batch: sequence s owns query tokens query_start_loc[s]:query_start_loc[s+1]."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = do not store
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32, context length after this step's tokens are stored
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0 past each seq's blocks
    block_size: int
    query_lens: list[int] = field(default_factory=list)  # host copies, for python-side loops
    seq_lens_host: list[int] = field(default_factory=list)
    # the rows whose slot is not -1, when some are (idle static riders store nothing); None when
    # every row stores. Known on the host when the step is built, so no backend has to ask the
    # device per layer.
    stored_rows: torch.Tensor | None = None  # [num_stored] int64
    _cache: dict = field(default_factory=dict, repr=False)  # per-step derived tensors (backends)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens) if self.query_lens else 0

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host) if self.seq_lens_host else 0

    @property
    def is_decode_only(self) -> bool:
        return all(q == 1 for q in self.query_lens)


def build_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Host lists -> device tensors. block_tables may be ragged; they are padded with 0.

    The integers are laid out in numpy arrays and cross to the device as two tensors (the
    int32 ones share one buffer), so the host cost is a few array operations per step, not a
    tensor per request."""
    n = len(query_lens)
    assert n == len(seq_lens) == len(block_tables)
    table_lens = np.fromiter(map(len, block_tables), np.int64, n)  # [num_seqs]
    max_blocks = max(int(table_lens.max()) if n else 0, 1)
    # one int32 buffer: [query_start_loc (n + 1) | seq_lens (n) | block_tables (n * max_blocks)]
    ints = np.zeros(2 * n + 1 + n * max_blocks, np.int32)
    np.cumsum(query_lens, out=ints[1:n + 1])
    ints[n + 1:2 * n + 1] = seq_lens
    tables = ints[2 * n + 1:].reshape(n, max_blocks)
    # each row's blocks, left-aligned: the True cells of this mask, in row-major order, are
    # exactly the concatenated tables
    tables[np.arange(max_blocks) < table_lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(block_tables), np.int32, int(table_lens.sum()))
    ints_dev = torch.from_numpy(ints).to(device)
    slots = np.asarray(slot_mapping, dtype=np.int64).reshape(-1)  # [num_tokens]
    stored_rows = None
    if slots.size and slots.min() < 0:
        stored_rows = torch.from_numpy(np.flatnonzero(slots >= 0)).to(device)
    return AttentionMetadata(
        slot_mapping=torch.from_numpy(slots).to(device),
        query_start_loc=ints_dev[:n + 1],
        seq_lens=ints_dev[n + 1:2 * n + 1],
        block_tables=ints_dev[2 * n + 1:].view(n, max_blocks),
        block_size=block_size,
        query_lens=list(query_lens),
        seq_lens_host=list(seq_lens),
        stored_rows=stored_rows,
    )


class AttentionBackend(ABC):
    """What the model calls per layer; one instance serves every layer of every step.

    Per-step work that every layer would repeat (plans, masks, workspaces) goes in
    `meta._cache`, computed by the first layer of the step."""

    name: str  # the registry name ("torch", "cpu", "triton")

    @abstractmethod
    def store_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, meta: AttentionMetadata) -> None:
        """Write k, v ([num_tokens, num_kv_heads, head_dim]) into the caches at
        meta.slot_mapping, skipping the rows whose slot is -1."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim] -> the attention output, same shape."""
