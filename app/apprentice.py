"""Training the EAGLE apprentice from the app: a button that runs `python -m
engine.spec.train_draft` as a child process of the app's server and a progress bar read
from its output, so a teacher never needs a terminal.

The trained head is not shipped with the code (tens of MB of weights, and it belongs to
the target model the server loads), so the first class on a machine trains it once; the
file lands in the ServeLab cache and every later session offers the apprentice at once.

One training per server process and model: a second click while one runs shows the same
progress. Streamlit-free except `panel`, which draws the button or the bar.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tqdm's lines, e.g. "1/2 the target's answers and features:  40%|####  | 88/220 [..."
PHASE = re.compile(r"([12])/2 [^:\r\n]*:\s*(\d+)%")


@dataclass
class Training:
    """One child `train_draft` process and its output file."""

    model: str
    proc: subprocess.Popen
    log: Path
    extra: list[str] = field(default_factory=list)
    announced: bool = False  # the app has rerun once for this finished training

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def failed(self) -> bool:
        return self.proc.poll() not in (None, 0)

    def tail(self, chars: int = 4000) -> str:
        try:
            data = self.log.read_bytes()[-chars:]
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")

    def progress(self) -> float:
        """0..1: the first phase (the target's answers and features) is the first half,
        training the head the second; 1.0 once the process has ended well."""
        if self.proc.poll() == 0:
            return 1.0
        return progress_of(self.tail())


def progress_of(output: str) -> float:
    """The fraction done, from train_draft's tqdm output so far."""
    hits = PHASE.findall(output)
    if not hits:
        return 0.0
    phase, pct = hits[-1]
    return min(1.0, (int(phase) - 1) * 0.5 + int(pct) / 200)


_LOCK = threading.Lock()
_JOBS: dict[str, Training] = {}


def command(model: str, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "engine.spec.train_draft", "--model", model, *(extra or [])]


def start(model: str, extra: list[str] | None = None) -> Training:
    """Start training the head for `model` unless one is running; return it."""
    with _LOCK:
        job = _JOBS.get(model)
        if job is not None and job.running:
            return job
        log = Path(tempfile.mkstemp(prefix="servelab-train-", suffix=".log")[1])
        env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
                   PYTHONUNBUFFERED="1")
        with log.open("wb") as out:
            proc = subprocess.Popen(command(model, extra), cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        job = _JOBS[model] = Training(model, proc, log, list(extra or []))
        return job


def current(model: str) -> Training | None:
    return _JOBS.get(model)


def stop_all() -> None:
    """End every training this process started (tests; the server's exit ends them too)."""
    with _LOCK:
        for job in _JOBS.values():
            if job.running:
                job.proc.terminate()
                job.proc.wait(timeout=30)
        _JOBS.clear()


def panel(model: str, t, ready: bool) -> None:
    """Where it is called (inside `with st.sidebar:`): the training's progress bar while it
    runs (redrawn every few seconds), its error if it failed, else the button that starts it."""
    import streamlit as st

    if ready:
        return
    job = current(model)

    @st.fragment(run_every=3.0 if job is not None and job.running else None)
    def view() -> None:
        job = current(model)
        if job is not None and job.running:
            done = job.progress()
            st.progress(done, text=t("apprentice.training", pct=round(100 * done)))
            return
        if job is not None and job.proc.poll() == 0 and not job.announced:
            # the head is written: rerun once so the switch offers it (once: a head written
            # elsewhere, with --out, must not rerun the app forever)
            job.announced = True
            st.rerun(scope="app")
        if job is not None and job.failed:
            st.error(t("apprentice.failed", tail=job.tail(400)))
        st.caption(t("apprentice.missing"))
        if st.button(t("apprentice.train"), key="apprentice_train"):
            start(model)
            st.rerun(scope="app")

    view()
