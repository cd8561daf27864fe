"""A recording replayed in the app (streamlit's AppTest through app/main.py): every page renders
from the bundled recording with no engine and no model, labelled as a recording with its
machine, date and configuration; Step shows exactly the recorded reports; a foreign file gets
a clear error in the reader's language."""

from __future__ import annotations

import gzip
import pathlib
import sys

import pytest
from streamlit.testing.v1 import AppTest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.live import SESSION_KEY  # noqa: E402
from app.pagelist import PAGES  # noqa: E402
from app.recorded import RecordedSession, bundled_recordings, open_recording  # noqa: E402
from engine.recording import read_recording  # noqa: E402

MAIN = str(ROOT / "app/main.py")
BUNDLED = ROOT / "assets" / "recordings" / "cpu-class-longtail.jsonl.gz"


def opened(lang: str = "en") -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["lang"] = lang
    rec = open_recording(BUNDLED, BUNDLED.name)
    at.session_state[SESSION_KEY] = rec
    return at


def test_the_bundled_recording_is_class_sized_and_small():
    assert BUNDLED in bundled_recordings()
    assert BUNDLED.stat().st_size < 300 * 1024
    rec = read_recording(BUNDLED)
    assert rec.complete and len(rec.runs) == 4 and all(len(r) > 20 for r in rec.runs)


# pages whose file draws the shell itself when AppTest runs it alone (the others get it from
# app/main.py in the app; under AppTest's switch_page they run bare)
SHELL_PAGES = ("home", "dashboard", "batching", "paging", "speculation", "calculators", "plan")


@pytest.mark.parametrize("slug", [p for p in PAGES if p != "classroom"])
def test_every_page_renders_from_the_recording(slug):
    at = opened()
    at.run()
    if slug != PAGES[0]:
        at.switch_page(f"pages/{slug}.py").run()
    assert not at.exception, at.exception[0].value
    if slug not in SHELL_PAGES:
        return
    label = "\n".join(h.value for h in at.html)
    assert "Replaying a recording" in label and "AMD EPYC" in label and "2026-" in label
    for _ in range(3):
        at.button(key="ctl_step").click().run()
        assert not at.exception, at.exception[0].value
    session = at.session_state[SESSION_KEY]
    assert isinstance(session, RecordedSession) and session.tick == 3
    assert not any(e.value.startswith("The engine") for e in at.error)


def test_stepping_shows_exactly_the_recorded_reports():
    rec = read_recording(BUNDLED)
    at = opened()
    at.run()
    at.switch_page("pages/dashboard.py").run()
    for _ in range(5):
        at.button(key="ctl_step").click().run()
    session = at.session_state[SESSION_KEY]
    assert session.primary.history == rec.runs[0][:5]
    assert [m.value for m in at.metric]  # the dashboard drew its gauges from them
    # play to the end: every run shows its whole recording, then Step has nothing left
    session.tick = 10_000
    at.run()
    assert session.primary.history == rec.runs[0] and session.primary.done
    assert not at.exception
    at.button(key="ctl_reset").click().run()
    assert session.tick == 0 and session.primary.history == []


def test_the_label_is_in_chinese_too():
    at = opened("zh")
    at.run()
    assert "正在回放录制" in "\n".join(h.value for h in at.html)


@pytest.mark.parametrize("lang, needle", [("en", "not a gzip-compressed ServeLab recording"),
                                          ("zh", "不是 gzip 压缩的 ServeLab 录制文件")])
def test_a_foreign_file_gets_a_clear_error(lang, needle):
    from app.replay import ERROR_KEY, open_into_session

    at = AppTest.from_function(_open_foreign, args=(lang,), default_timeout=60)
    at.run()
    assert not at.exception
    assert needle in at.session_state[ERROR_KEY]
    assert open_into_session  # the app's own opener gave that text


def _open_foreign(lang: str) -> None:
    import streamlit as st

    from app.replay import open_into_session

    st.session_state["lang"] = lang
    open_into_session(b"id,name\n1,not a recording\n", "foreign.csv")


def test_a_header_of_another_kind_is_refused():
    from engine.recording import RecordingError

    with pytest.raises(RecordingError) as err:
        open_recording(gzip.compress(b'{"kind": "chat-log", "version": 1}\n'))
    assert err.value.code == "foreign"


def test_a_live_session_recorded_replays_its_own_reports(tmp_path):
    """The app's save path on a real (tiny) engine: every run the session drew, replayed step
    for step, equals the live run's reports."""
    import json

    from app.recorded import page_variants, record_session_runs
    from app.state import Session, Settings
    from benchmarks.gpu.tiny import save_tiny_llama

    model = str(save_tiny_llama(tmp_path / "tiny"))
    settings = Settings(model=model, num_requests=3, seats=2, num_blocks=48)
    live = Session(settings=settings)
    path = record_session_runs(live, page_variants(settings), tmp_path / "s.jsonl.gz")
    replay = open_recording(path)
    assert set(replay.runs) == set(live.runs)
    replay.tick = live.tick
    for settings_, run in live.runs.items():
        assert replay.run(settings_).history == json.loads(json.dumps(run.history))
        assert replay.run(settings_).names == run.names
    with pytest.raises(ValueError, match="no run"):
        replay.run(settings.with_(seats=7))
    # the same runs as one trace: each run's processes named by its switches, the sidebar's
    # first, and every request of every run on a track of its own
    from app.recorded import session_trace

    trace = json.loads(session_trace(live))
    processes = [e["args"]["name"] for e in trace["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(processes) == 3 * len(live.runs)
    s = settings
    assert processes[0] == f"seats ({s.batching} · {s.kv_layout} · spec {s.spec})"
    tracks = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
              and e["args"]["name"].startswith("request ")]
    assert len(tracks) == sum(len({rid for r in run.history for rid in
                                   [*r["waiting"], *r["admitted"], *r["finished"]]})
                              for run in live.runs.values())


@pytest.mark.slow
def test_the_sidebar_saves_the_live_run_and_opens_the_bundled_one():
    """Live app: step, save (a recording of the session's runs is offered for download), then
    open the bundled recording from the sidebar and close it again."""
    from app.replay import SAVED_KEY

    at = AppTest.from_file(MAIN, default_timeout=300)
    at.session_state["lang"] = "en"
    at.run()
    at.button(key="ctl_step").click().run()
    at.button(key="rec_save").click().run()
    assert not at.exception, at.exception[0].value
    saved = open_recording(at.session_state[SAVED_KEY])
    assert saved.primary.reports[0]["step"] == 1 and saved.recording.source == "app"
    assert [b.label for b in at.get("download_button")][-2:] == [
        "Download the recording", "Download as a trace (opens in Perfetto, chrome://tracing)"]
    live = at.session_state[SESSION_KEY]
    at.selectbox(key="rec_bundled").set_value(BUNDLED.name)
    at.button(key="rec_open").click().run()
    assert isinstance(at.session_state[SESSION_KEY], RecordedSession)
    assert "Replaying a recording" in "\n".join(h.value for h in at.html)
    at.button(key="rec_close").click().run()
    assert at.session_state[SESSION_KEY] is live
