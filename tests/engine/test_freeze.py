"""freeze_startup_heap: what a serving process does once its engine is built, and only there."""

import gc

from engine.config import EngineConfig
from engine.engine import LLMEngine, freeze_startup_heap


def test_the_startup_heap_is_frozen_and_can_be_thawed():
    before = gc.get_freeze_count()
    kept = [{"startup": i} for i in range(1000)]  # container objects the collector tracks
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= before + len(kept)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_building_an_engine_freezes_nothing():
    """The app builds and drops engines in one process: an engine frozen there would never be
    collected if it sat in a reference cycle, KV pool included."""
    gc.unfreeze()
    LLMEngine(EngineConfig(max_num_seqs=2, max_model_len=64))
    assert gc.get_freeze_count() == 0
