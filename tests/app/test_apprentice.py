"""Training the EAGLE apprentice from the app (app/apprentice.py): the progress read from
train_draft's own tqdm output, a real (tiny) training run as a child process, and the
sidebar's button in both languages while no head exists."""

from __future__ import annotations

import io
import pathlib
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app import apprentice  # noqa: E402


def tqdm_output(desc: str, total: int, done: int) -> str:
    from tqdm import tqdm

    buf = io.StringIO()
    with tqdm(total=total, desc=desc, file=buf, mininterval=0) as bar:
        bar.update(done)
    return buf.getvalue()


def test_progress_follows_both_phases_of_train_drafts_output():
    assert apprentice.progress_of("") == 0.0
    first = tqdm_output("1/2 the target's answers and features", 200, 100)
    assert apprentice.progress_of(first) == pytest.approx(0.25)
    second = first + tqdm_output("2/2 training the head", 60, 45)
    assert apprentice.progress_of(second) == pytest.approx(0.5 + 0.75 / 2)
    done = second + tqdm_output("2/2 training the head", 60, 60)
    assert apprentice.progress_of(done) == pytest.approx(1.0)


@pytest.mark.slow
def test_a_tiny_training_runs_as_a_child_and_writes_its_head(tmp_path):
    out = tmp_path / "head.safetensors"
    extra = ["--quick", "--prompts", "2", "--steps", "2", "--max-tokens", "8", "--out", str(out)]
    job = apprentice.start("smollm2-135m", extra)
    try:
        assert apprentice.start("smollm2-135m", extra) is job, "one training at a time"
        seen = []
        deadline = time.monotonic() + 600
        while job.running and time.monotonic() < deadline:
            seen.append(job.progress())
            time.sleep(0.5)
        assert not job.running, "the tiny training did not end in 10 minutes"
        assert job.proc.returncode == 0, job.tail()
        assert job.progress() == 1.0 and out.is_file()
        assert all(0.0 <= p <= 1.0 for p in seen) and seen == sorted(seen)
        # the app reruns once for the finished training, not forever (its head is elsewhere)
        from streamlit.testing.v1 import AppTest

        at = AppTest.from_file(str(ROOT / "app/main.py"), default_timeout=120).run()
        assert not at.exception, at.exception[0].value
        assert job.announced
    finally:
        apprentice.stop_all()
        job.log.unlink(missing_ok=True)
