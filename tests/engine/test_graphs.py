"""CUDA graphs for decode steps (engine/graphs.py) and the step's one host-to-device copy.

On a CPU `cuda_graphs=True` runs the graph path with `ReplayCapture`, which calls the captured
forward again over the same static buffers: padding, the copy into the buffers, the dummy KV
block and the slicing all run here; only torch.cuda.CUDAGraph itself needs the GPU test.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, SamplingParams
from engine.engine import LLMEngine
from engine.graphs import DecodeGraphs, padded_sizes
from engine.model.attention import build_step
from tests.conftest import assert_blocks_consistent

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there lived",
           "SELECT name, age FROM users WHERE", "List three primary colors:"]


def _engine(**kw) -> LLMEngine:
    base = dict(dtype="float32", max_num_seqs=6, max_model_len=96)
    base.update(kw)
    return LLMEngine(EngineConfig(**base))


def _serve(eng: LLMEngine) -> dict[str, list[int]]:
    """Requests join and leave: two at first, three more after two steps, each its own length,
    so decode steps run 1 to 5 requests (3 and 5 need padding)."""
    lengths = [7, 11, 3, 9, 5]
    rids = [eng.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True))
            for p, m in zip(PROMPTS[:2], lengths[:2])]
    for _ in range(2):
        eng.step()
    rids += [eng.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True))
             for p, m in zip(PROMPTS[2:], lengths[2:])]
    while eng.has_unfinished():
        eng.step()
    return {r: eng.requests[r].output_token_ids for r in rids}


def test_flag_defaults_off_on_cpu_and_is_checked():
    assert EngineConfig().cuda_graphs is None
    eng = _engine(max_num_seqs=2)
    assert not eng.uses_graphs and eng.runner.graphs is None
    assert eng.pool.num_blocks == eng.allocator.num_blocks  # no dummy block without graphs
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineConfig(cuda_graphs="yes")


def test_padded_sizes():
    assert padded_sizes(1) == [1]
    assert padded_sizes(6) == [1, 2, 4, 6]
    assert padded_sizes(16) == [1, 2, 4, 8, 16]
    assert padded_sizes(40) == [1, 2, 4, 8, 16, 32, 40]


@pytest.mark.parametrize("kw", [{}, {"batching": "static"}, {"kv_layout": "contiguous"}],
                         ids=["continuous-paged", "static", "contiguous"])
def test_greedy_tokens_equal_eager_as_requests_join_and_leave(kw):
    eager = _serve(_engine(cuda_graphs=False, **kw))
    eng = _engine(cuda_graphs=True, **kw)
    graphs: DecodeGraphs = eng.runner.graphs
    assert graphs is not None and eng.pool.num_blocks == eng.allocator.num_blocks + 1
    batches = []
    forward = graphs.forward
    graphs.forward = lambda ids, *a: (batches.append(len(ids)), forward(ids, *a))[1]
    assert _serve(eng) == eager
    # decode steps ran in graphs, some of them padded (n < its padded size)
    assert batches and sum(graphs.replays.values()) == len(batches)
    assert any(n not in graphs.sizes for n in batches), batches
    assert set(graphs.graphs) == set(graphs.replays)  # captured once per size used
    assert_blocks_consistent(eng.allocator, [])
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks


def test_padding_rows_never_write_a_real_requests_kv():
    eng = _engine(cuda_graphs=True, max_num_seqs=4)
    reqs = [eng.requests[eng.add_request(p, SamplingParams(max_tokens=20, ignore_eos=True))]
            for p in PROMPTS[:3]]
    while any(r.num_output_tokens < 2 for r in reqs):  # prefilled, then decoding
        eng.step()
    positions = [r.num_computed_tokens for r in reqs]  # what this step writes, per request
    dummy = eng.runner.graphs.dummy_block
    eng.pool.data[:, :, dummy] = 0  # earlier padding rows wrote the same values there
    before = eng.pool.data.clone()
    eng.step()
    assert eng.runner.graphs.replays.get(4), "3 running requests should replay the size-4 graph"
    changed = (eng.pool.data != before).flatten(4).any(-1).any(0).any(0)  # [blocks, block_size]
    bs = eng.config.block_size
    real = {eng.allocator.slot(r, p) for r, p in zip(reqs, positions)}
    written = {int(s) for s in changed.flatten().nonzero().flatten()}
    assert written - real <= set(range(dummy * bs, (dummy + 1) * bs)), sorted(written - real)
    assert changed[dummy].any(), "the padding row stores its K/V in the dummy block"
    assert dummy not in {b for r in reqs for b in r.block_table}


def test_capture_all_takes_every_size_up_front_and_writes_only_the_dummy_block():
    """What a GPU engine does when it starts (vLLM captures its graphs then too): every padded
    size captured before any request, with padding rows whose K/V go to the dummy block only;
    serving afterwards captures nothing more and gives the eager engine's tokens."""
    eager = _serve(_engine(cuda_graphs=False))
    eng = _engine(cuda_graphs=True)
    graphs: DecodeGraphs = eng.runner.graphs
    assert not graphs.graphs  # on a CPU nothing is captured at start (the stand-in)
    dummy = graphs.dummy_block
    eng.pool.data.fill_(7.0)
    graphs.capture_all()
    assert set(graphs.graphs) == set(graphs.sizes) == {1, 2, 4, 6}
    changed = (eng.pool.data != 7.0).flatten(4).any(-1).any(0).any(0).any(-1)  # [blocks]
    assert changed.nonzero().flatten().tolist() == [dummy]
    captured = dict(graphs.graphs)
    assert _serve(eng) == eager
    assert graphs.graphs == captured and sum(graphs.replays.values()) > 0
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks


def test_a_step_crosses_to_the_device_in_one_copy():
    ids, pos, rows = [5, 6, 7, 8], [3, 0, 1, 2], [0, 3]
    meta, (t_ids, t_pos, t_rows) = build_step([1, 3], [4, 3], [[2], [0, 1]], [11, -1, 4, 5], 2,
                                              "cpu", (ids, pos, rows))
    tensors = [meta.slot_mapping, meta.query_start_loc, meta.seq_lens, meta.block_tables,
               meta.stored_rows, t_ids, t_pos, t_rows]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1  # one buffer
    assert meta.slot_mapping.dtype == t_ids.dtype == torch.int64
    assert meta.seq_lens.dtype == meta.block_tables.dtype == torch.int32
    assert (t_ids.tolist(), t_pos.tolist(), t_rows.tolist()) == (ids, pos, rows)
    assert meta.slot_mapping.tolist() == [11, -1, 4, 5] and meta.stored_rows.tolist() == [0, 2, 3]
    assert meta.query_start_loc.tolist() == [0, 1, 4] and meta.seq_lens.tolist() == [4, 3]
    assert meta.block_tables.tolist() == [[2, 0], [0, 1]]


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: torch.cuda.CUDAGraph capture and replay")
def test_cuda_graphs_on_a_gpu_give_the_eager_tokens():
    eager = _serve(_engine(device="cuda", cuda_graphs=False, num_kv_blocks=64))
    eng = _engine(device="cuda", num_kv_blocks=64)  # None: on for CUDA
    assert eng.uses_graphs
    assert _serve(eng) == eager
    assert eng.runner.graphs.replays and eng.allocator.num_free_blocks == 64
