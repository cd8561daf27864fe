"""CUDA graphs for decode steps: launch a whole forward with one call (`cuda_graphs` switch).

A decode step of a small model is hundreds of tiny kernels; on a GPU the host often spends
longer launching them than the GPU spends running them. A CUDA graph records the launches once
and replays them with one call. The price: a graph replays the SAME kernels on the SAME memory
with the SAME shapes, so

  * every input lives in a static buffer, and a step copies its values into it;
  * shapes are fixed, so a batch of n requests runs in the graph of the next padded size
    (1, 2, 4, 8, then multiples of 16 up to max_num_seqs); padding rows compute a dummy token
    whose K/V go to a dummy block no request owns, and their outputs are sliced away;
  * anything the host decides per step is frozen at capture: the attention backends read the
    largest context (the block table's width) as the step's maximum, and the real lengths from
    the device (seq_lens).

Only decode-only steps (every request computes one token) take a graph; prefill chunks, mixed
steps and verification of drafts run eagerly, as in vLLM and nano-vllm. This follows
nano-vllm's `ModelRunner.capture_cudagraph` (github.com/GeeeekExplorer/nano-vllm) and vLLM's
CUDA-graph runner (static buffers, padded batch sizes, one shared memory pool). On a GPU the
engine captures every padded size when it starts (`capture_all`, as vLLM does), so no request
waits on a capture; elsewhere (the CPU stand-in below) a padded size gets its graph the first
time a step needs it.

The capture itself is behind `_Capture`: `CudaCapture` is the real one; `ReplayCapture` (a CPU,
tests) "replays" by calling the captured function again over the same static buffers, so the
padding, the copies into the buffers, the dummy slot and the slicing run on any machine.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.model.attention import AttentionMetadata, Staging
from engine.model.attention.base import fill_tables


class _Capture:
    """One captured forward: `replay()` runs it again over the static buffers; its output is
    always the same tensor (a graph writes where it wrote at capture)."""

    out: torch.Tensor

    def replay(self) -> torch.Tensor:
        raise NotImplementedError


class CudaCapture(_Capture):
    """torch.cuda.CUDAGraph: warm up on a side stream (Triton compiles, cuBLAS picks its
    kernels), then record one forward into the graph pool every size shares."""

    def __init__(self, fn, pool):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class ReplayCapture(_Capture):
    """The CPU stand-in: calls the function again and writes into the same output tensor."""

    def __init__(self, fn, pool=None):
        self.fn = fn
        self.out = fn()

    @torch.inference_mode()  # the output is an inference tensor, as the forward made it
    def replay(self) -> torch.Tensor:
        return self.out.copy_(self.fn())


def padded_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, 8, 16, 32, ... below max_num_seqs, and it."""
    small = [s for s in (1, 2, 4, 8, *range(16, max_num_seqs, 16)) if s < max_num_seqs]
    return [*small, max_num_seqs]


class DecodeGraphs:
    """Static buffers, one graph per padded batch size, and the copy of a step into them.

    All static inputs are views of ONE int32 device buffer, laid out like the host buffer a step
    fills, so a step crosses to the device in one copy:
        int64 (as int32 pairs): token ids [M] | positions [M] | slots [M] | logit rows [M]
        int32:                  seq_lens [M] | query_start_loc [M + 1] | block tables [M, W]
    M = max_num_seqs, W = the widest block table a graph takes. Padding rows: token 0 at
    position 0, stored in the dummy block's first slot, attending to that block only.
    """

    def __init__(self, model, pool, backend, device: torch.device, block_size: int,
                 max_num_seqs: int, max_blocks: int, dummy_block: int, capture=None):
        self.model, self.pool, self.backend = model, pool, backend
        self.block_size, self.dummy_block = block_size, dummy_block
        self.sizes = padded_sizes(max_num_seqs)
        M, W = self.max_batch, self.max_blocks = max_num_seqs, max_blocks
        self._n = 8 * M + M + (M + 1) + M * W
        self.static = torch.zeros(self._n, dtype=torch.int32, device=device)
        self.ids, self.positions, self.slots, self.logit_rows = (
            self.static[:8 * M].view(torch.int64).view(4, M))
        ints = self.static[8 * M:]
        self.seq_lens, self.query_start_loc = ints[:M], ints[M:2 * M + 1]
        self.block_tables = ints[2 * M + 1:].view(M, W)
        self.staging = Staging(device)
        self.capture = capture or (CudaCapture if device.type == "cuda" else ReplayCapture)
        self.graph_pool = torch.cuda.graph_pool_handle() if self.capture is CudaCapture else None
        self.graphs: dict[int, _Capture] = {}
        self.replays: dict[int, int] = {}  # padded size -> steps it ran (tests, reports)

    def capture_all(self) -> None:
        """Capture every padded size now, as vLLM does at startup: captured lazily, a size's
        first decode step also pays its capture (two eager warm-up forwards and the recording),
        and a long tail draining from 256 running walks through 20 sizes while it serves.
        Every row is padding for this: token 0 at position 0, its K/V written to the dummy
        block, so no block a request could own is touched."""
        M = self.max_batch
        host = self.staging.host(self._n)  # zeroed: token ids, positions and logit rows 0
        ints = host[8 * M:]
        host[:8 * M].view(np.int64).reshape(4, M)[2] = self.dummy_block * self.block_size
        ints[:M] = 1  # seq_lens
        ints[M:2 * M + 1] = np.arange(M + 1)  # query_start_loc
        ints[2 * M + 1:].reshape(M, -1)[:, 0] = self.dummy_block
        self.staging.send(out=self.static)
        for B in self.sizes:
            if B not in self.graphs:
                self.graphs[B] = self.capture(self._step_fn(B), self.graph_pool)

    def fits(self, query_lens: list[int], tables: list[list[int]]) -> bool:
        """Can this step run in a graph: decode only, few enough requests, tables narrow enough?"""
        return (0 < len(query_lens) <= self.max_batch and all(q == 1 for q in query_lens)
                and max(map(len, tables)) <= self.max_blocks)

    def forward(self, input_ids: list[int], positions: list[int], slots: list[int],
                tables: list[list[int]], logit_index: list[int], fill=None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of n = len(input_ids) requests (slot -1: store nothing) ->
        (final hidden states [n, hidden], the logit rows [len(logit_index)] on the device).
        The hidden states are the graph's output buffer: the next replay overwrites them.
        `fill`: (row indices, token ids on the device) written into the static token ids
        after the step's copy (async scheduling's pending tokens, engine/runner.py)."""
        n, M = len(input_ids), self.max_batch
        B = next(s for s in self.sizes if s >= n)
        dummy_slot = self.dummy_block * self.block_size
        host = self.staging.host(self._n)
        ids, pos, slot, rows = host[:8 * M].view(np.int64).reshape(4, M)
        ints = host[8 * M:]
        seq_lens, qsl, table = ints[:M], ints[M:2 * M + 1], ints[2 * M + 1:].reshape(M, -1)
        ids[:n], pos[:n], rows[:len(logit_index)] = input_ids, positions, logit_index
        slot[:n] = slots
        slot[:n][slot[:n] < 0] = dummy_slot  # idle static riders: their write goes nowhere real
        slot[n:B] = dummy_slot
        seq_lens[:n] = pos[:n] + 1
        seq_lens[n:B] = 1
        qsl[:] = np.arange(M + 1)
        fill_tables(table[:n], tables)
        table[n:B, 0] = self.dummy_block
        self.staging.send(out=self.static)
        if fill is not None:
            self.ids[fill[0]] = fill[1].to(self.ids.dtype)
        graph = self.graphs.get(B)
        if graph is None:
            graph = self.graphs[B] = self.capture(self._step_fn(B), self.graph_pool)
        self.replays[B] = self.replays.get(B, 0) + 1
        return graph.replay()[:n], self.logit_rows[:len(logit_index)]

    def _step_fn(self, B: int):
        """The forward of the first B rows of the static buffers, as a graph records it."""
        W = self.max_blocks
        meta = AttentionMetadata(
            slot_mapping=self.slots[:B], query_start_loc=self.query_start_loc[:B + 1],
            seq_lens=self.seq_lens[:B], block_tables=self.block_tables[:B],
            block_size=self.block_size, query_lens=[1] * B,
            # frozen at capture: the longest context a row of this table can hold
            seq_lens_host=[W * self.block_size] * B)
        ids, positions = self.ids[:B], self.positions[:B]

        def step() -> torch.Tensor:
            meta._cache.clear()  # per-step plans are rebuilt from the buffers, as a replay does
            return self.model.forward(ids, positions, meta, self.pool.layers, self.backend)

        return step
