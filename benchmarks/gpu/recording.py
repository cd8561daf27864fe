"""The GPU check's recording: a class-sized run of the app's pages on the lent GPU, saved as a
recording (engine/recording.py) that a laptop class replays without the engine.

`record_class_run(out_dir, model, dry)` plays the runs every live page draws (the sidebar's
settings, static batching, the contiguous layout, n-gram speculation; app/recorded.py) for a
class-sized workload and writes OUT_DIR/recording-gpu.jsonl.gz; the file's header names the
GPU. `python -m benchmarks.gpu.check` calls it after its sections when time is left; the CPU
dry run does the same with a tiny model and three requests (the code path, not the figures).
"""

from __future__ import annotations

from pathlib import Path

CLASS_REQUESTS = 48  # the sidebar's largest class
CLASS_SEATS = 16
CLASS_BLOCKS = 256
FILE = "recording-gpu.jsonl.gz"


def record_class_run(out_dir: str | Path, model: str = "smollm2-135m", dry: bool = False,
                     requests: int | None = None) -> dict:
    """Record the pages' runs; returns what the check's JSON keeps about it."""
    from app.recorded import page_variants, record_session_runs
    from app.state import Session, Settings
    from engine.recording import read_recording

    n = requests or (3 if dry else CLASS_REQUESTS)
    settings = Settings(model=model, num_requests=n, seats=4 if dry else CLASS_SEATS,
                        num_blocks=64 if dry else CLASS_BLOCKS)
    path = record_session_runs(Session(settings=settings), page_variants(settings),
                               Path(out_dir) / FILE)
    rec = read_recording(path)  # what a class will open: it must read back
    return {"ok": True, "path": str(path), "bytes": path.stat().st_size,
            "steps": [len(r) for r in rec.runs], "machine": rec.machine, "requests": n}
