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

import array
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


class Staging:
    """The host buffer a step's integers are laid out in before their one copy to the device.

    On CUDA it is pinned and reused, so the copy is asynchronous; before it is filled again we
    wait for the previous copy out of it (an event, normally long finished). On a CPU every step
    gets a fresh array, which the "device" tensors then simply share."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._pinned: torch.Tensor | None = None
        self._copied = None  # CUDA event recorded after the last copy out of _pinned
        self._host: np.ndarray | None = None

    def host(self, n: int) -> np.ndarray:
        """A zeroed int32 array of n to fill (valid until the next call)."""
        if self.device.type != "cuda":
            self._host = np.zeros(n, np.int32)
            return self._host
        if self._copied is not None:
            self._copied.synchronize()
        if self._pinned is None or self._pinned.numel() < n:
            self._pinned = torch.empty(max(n, 1024), dtype=torch.int32, pin_memory=True)
        self._host = self._pinned[:n].numpy()
        self._host.fill(0)
        return self._host

    def send(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The last `host` array on the device, in one copy (into `out` when given)."""
        src = torch.from_numpy(self._host)
        if self.device.type != "cuda":
            return src if out is None else out.copy_(src)
        out = torch.empty(src.shape, dtype=src.dtype, device=self.device) if out is None else out
        out.copy_(src, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return out


def fill_tables(dst: np.ndarray, block_tables: list[list[int]]) -> None:
    """Each row's blocks, left-aligned, into dst [len(block_tables), max_blocks] (already
    zeroed): the True cells of the mask, in row-major order, are exactly the concatenated
    tables, so this is one array operation, not one per request."""
    lens = np.fromiter(map(len, block_tables), np.int64, len(block_tables))
    dst[np.arange(dst.shape[1]) < lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(block_tables), np.int32, int(lens.sum()))


def build_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Host lists -> device tensors. block_tables may be ragged; they are padded with 0."""
    return build_step(query_lens, seq_lens, block_tables, slot_mapping, block_size, device)[0]


def build_step(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
    int64_arrays: tuple = (),
    staging: Staging | None = None,
) -> tuple[AttentionMetadata, list[torch.Tensor]]:
    """`build_metadata`, plus the step's other integer arrays (the runner's token ids,
    positions and logit rows) as int64 device tensors, all in ONE host buffer and one copy.

    The buffer is int32: first the int64 arrays as pairs of int32 (slot_mapping, the
    int64_arrays, the stored rows when some slot is -1), then query_start_loc (n + 1), seq_lens
    (n) and the block tables (n x max_blocks), each starting on a 16-byte boundary. On the
    device the first part is viewed as int64 again. The buffer's bytes come from Python's
    `array` (C loops over the lists the runner made), not from a dozen NumPy calls: on a CPU
    those ran right after the step's weights had streamed through the caches, and cost a
    batch-1 decode step more than twice as long (docs/performance.md)."""
    n = len(query_lens)
    assert n == len(seq_lens) == len(block_tables)
    slots = _int_list(slot_mapping)
    longs = [slots, *map(_int_list, int64_arrays)]
    has_skips = any(s < 0 for s in slots)
    if has_skips:  # idle static rows: the rows that do store, known here rather than per layer
        longs.append([i for i, s in enumerate(slots) if s >= 0])
    max_blocks = max(max(map(len, block_tables), default=0), 1)
    # every array starts on a 16-byte boundary (int64 arrays padded to an even length, int32
    # ones to a multiple of 4): Triton specializes a kernel on whether each pointer is 16-byte
    # aligned, so offsets that moved with the batch size would compile new kernels while serving
    wide = array.array("q")
    starts64 = []
    for a in longs:
        starts64.append(len(wide))
        wide.extend(a)
        wide.extend(itertools.repeat(0, len(a) % 2))
    ints = array.array("i", itertools.accumulate(query_lens, initial=0))
    ints.extend(itertools.repeat(0, -len(ints) % 4))
    at_seq_lens = len(ints)
    ints.extend(seq_lens)
    ints.extend(itertools.repeat(0, -len(ints) % 4))
    at_tables = len(ints)
    for table in block_tables:  # each row's blocks, then zeros to max_blocks
        ints.extend(table)
        ints.extend(itertools.repeat(0, max_blocks - len(table)))
    n64 = len(wide)
    if staging is not None and staging.device.type == "cuda":
        host = staging.host(2 * n64 + len(ints))
        host[:2 * n64].view(np.int64)[:] = wide
        host[2 * n64:] = ints
        dev = staging.send()
    else:
        dev = torch.frombuffer(bytearray(wide.tobytes() + ints.tobytes()), dtype=torch.int32)
        if torch.device(device).type != "cpu":
            dev = dev.to(device)
    dev64, dev32 = dev[:2 * n64].view(torch.int64), dev[2 * n64:]
    parts = [dev64[at:at + len(a)] for at, a in zip(starts64, longs)]
    meta = AttentionMetadata(
        slot_mapping=parts[0],
        query_start_loc=dev32[:n + 1],
        seq_lens=dev32[at_seq_lens:at_seq_lens + n],
        block_tables=dev32[at_tables:].view(n, max_blocks),
        block_size=block_size,
        query_lens=list(query_lens),
        seq_lens_host=list(seq_lens),
        stored_rows=parts[-1] if has_skips else None,
    )
    return meta, parts[1:len(parts) - has_skips]


def _int_list(a) -> list[int]:
    """A list of Python ints (the runner's lists as they are; tensors and arrays converted)."""
    return a if isinstance(a, list) else np.asarray(a).reshape(-1).tolist()


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
