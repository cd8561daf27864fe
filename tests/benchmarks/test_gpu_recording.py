"""The GPU check's recording code path on the CPU: a tiny model, three requests, the pages'
four runs written as a recording that reads back, names this machine, and replays."""

from __future__ import annotations

from benchmarks.gpu.recording import FILE, record_class_run
from benchmarks.gpu.tiny import save_tiny_llama


def test_record_class_run_writes_a_replayable_recording(tmp_path):
    from app.recorded import open_recording

    model = save_tiny_llama(tmp_path / "tiny-llama")
    res = record_class_run(tmp_path, str(model), dry=True)
    assert res["ok"] and res["path"].endswith(FILE) and res["requests"] == 3
    assert len(res["steps"]) == 4 and all(s > 0 for s in res["steps"])
    assert res["machine"].get("cores")
    session = open_recording(tmp_path / FILE)
    session.tick = 10_000
    assert session.primary.done and session.primary.history
    emitted = sum(len(e["token_ids"]) for r in session.primary.history for e in r["emitted"])
    assert emitted > 0
