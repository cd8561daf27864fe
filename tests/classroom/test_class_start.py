"""The class server's start as the Classroom page follows it (classroom/client.py): the
progress a download writes into the server's log, read back as the page shows it; a start
that keeps writing is waited for, one silent too long is given up, one that exits says why,
and Cancel ends the process. Real processes (a stand-in for the server that writes as
huggingface_hub's download does), no class server needed."""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from classroom import client
from classroom.client import ClassRoom, ClassServer, start_progress


def test_a_downloads_progress_bar_is_read_as_huggingface_hub_writes_it():
    from huggingface_hub.utils import tqdm

    out = io.StringIO()
    bar = tqdm(total=988_000_000, unit="B", unit_scale=True, desc="model.safetensors",
               file=out, mininterval=0)
    bar.update(445_000_000)
    bar.refresh()
    fraction, text = start_progress("[servelab] resolving the model\n" + out.getvalue())
    assert fraction == pytest.approx(0.45) and text.startswith("model.safetensors 45% · 445M/988M")
    assert start_progress(out.getvalue() + "\n[servelab] loading weights\n") == (
        None, "[servelab] loading weights")
    assert start_progress("") is None


# A stand-in for a starting class server: it writes a progress bar as a download does, every
# 0.1 s for `moving` seconds, then `after` ("sleep": silent; "exit": it ends with a message)
STAND_IN = r"""
import sys, time
moving, after = float(sys.argv[1]), sys.argv[2]
t0 = time.monotonic()
while time.monotonic() - t0 < moving:
    pct = int(100 * (time.monotonic() - t0) / moving)
    sys.stdout.write(f"\rmodel.safetensors:  {pct}%|#   | {pct}M/100M [00:01<00:01, 9MB/s]")
    sys.stdout.flush()
    time.sleep(0.1)
if after == "exit":
    print("\nModelLoadError: could not reach the endpoint", flush=True)
    sys.exit(2)
time.sleep(60)
"""


def _stand_in(monkeypatch, moving: float, after: str) -> None:
    """ClassRoom.begin_start launches the stand-in instead of the class server (no port
    answers, so it is 'starting' for as long as it runs)."""
    def start(switches, **kw):
        assert kw["ready_timeout"] == 0  # the page's start returns at once
        log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
        proc = subprocess.Popen([sys.executable, "-c", STAND_IN, str(moving), after],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return ClassServer(url=f"http://127.0.0.1:{client.free_port()}", proc=proc,
                           log_path=Path(log.name))

    monkeypatch.setattr(ClassServer, "start", staticmethod(start))


def _poll_until(room: ClassRoom, seconds: float):
    """poll_start for up to `seconds`, as the page's fragment does: every look it returned."""
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(room.poll_start())
        time.sleep(0.1)
    return seen


def test_a_start_that_keeps_writing_is_waited_for_and_cancel_ends_it(monkeypatch):
    monkeypatch.setattr(client, "START_QUIET_S", 1.0)  # silent 1 s: given up
    _stand_in(monkeypatch, moving=30, after="sleep")
    room = ClassRoom()
    room.begin_start(client.DEFAULT_SWITCHES, on_network=False)
    proc = room.launching.proc
    try:
        seen = _poll_until(room, 2.5)  # longer than START_QUIET_S: the bar moves meanwhile
        bars = [s for s in seen if s and s[0] is not None]
        assert bars and bars[-1][1].startswith("model.safetensors"), seen
        assert bars[-1][0] > bars[0][0] or len({b[1] for b in bars}) > 1, "the bar moved"
        assert room.launching is not None and room.server is None
        room.cancel_start()
        assert room.launching is None and room.server is None
        assert proc.wait(timeout=10) is not None, "Cancel ends the process"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_silent_start_is_given_up_and_an_exit_says_why(monkeypatch):
    monkeypatch.setattr(client, "START_QUIET_S", 1.0)
    _stand_in(monkeypatch, moving=0.3, after="sleep")  # a bar, then silence
    room = ClassRoom()
    room.begin_start(client.DEFAULT_SWITCHES, on_network=False)
    proc = room.launching.proc
    with pytest.raises(RuntimeError, match="wrote nothing, for 1 s"):
        _poll_until(room, 5)
    assert room.launching is None and proc.wait(timeout=10) is not None

    _stand_in(monkeypatch, moving=0.3, after="exit")
    room.begin_start(client.DEFAULT_SWITCHES, on_network=False)
    with pytest.raises(RuntimeError, match="(?s)exited while starting.*could not reach"):
        _poll_until(room, 5)
    assert room.launching is None and room.server is None
