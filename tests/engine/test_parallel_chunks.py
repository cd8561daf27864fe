"""parallel_chunks (engine/model/cpu/parallel.h), how the C++ kernels share an op among threads:
every index computed exactly once, whatever the size and thread count; a thread held up leaves
what it has not started to the others; an error in one chunk reaches the caller."""

from __future__ import annotations

import pytest
import torch

from engine.model.cpu import library

pytestmark = pytest.mark.skipif(not library.load(), reason="the C++ CPU kernels did not load")


def trace(n: int, min_chunk: int = 1, threads: int = 2, slow: int = -1, sleep_us: int = 0,
          throw_at: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(how many times each index was computed, the thread that computed it)"""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        counts, who = torch.ops.servelab.parallel_chunks_trace(n, min_chunk, slow, sleep_us,
                                                               throw_at)
    finally:
        torch.set_num_threads(before)
    return counts, who


@pytest.mark.parametrize("n, min_chunk, threads", [
    (1, 1, 2), (2, 1, 2), (7, 2, 2), (36, 2, 2), (3072, 2, 2), (1000, 1, 3), (5, 1, 4),
    (4, 4, 2), (97, 3, 5)])
def test_every_index_is_computed_once(n, min_chunk, threads):
    for _ in range(20):  # the threads race differently each time
        counts, who = trace(n, min_chunk, threads)
        assert torch.equal(counts, torch.ones(n, dtype=torch.int32))
        assert int(who.min()) >= 0 and int(who.max()) < threads


def test_a_held_up_thread_leaves_its_share_to_the_other():
    # thread 1 sleeps 20 ms in each chunk it takes: thread 0 does its own half of the 64 indices,
    # then takes thread 1's, all but the chunks thread 1 had begun (at most 8 each)
    counts, who = trace(64, threads=2, slow=1, sleep_us=20_000)
    assert torch.equal(counts, torch.ones(64, dtype=torch.int32))
    assert int((who == 0).sum()) >= 48, who.tolist()


def test_an_error_in_one_chunk_reaches_the_caller():
    with pytest.raises(RuntimeError, match="failed at index 40"):
        trace(64, threads=2, throw_at=40)
    counts, _ = trace(64, threads=2)  # and the next call runs as before
    assert torch.equal(counts, torch.ones(64, dtype=torch.int32))
