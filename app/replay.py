"""The app's recordings: open one (an upload or a file under assets/recordings/), replay it with
the same Step / Play / Reset and the same pages, labelled on every page with its machine, date
and configuration; save the live session's runs as one.

While a recording is open, `st.session_state[SESSION_KEY]` holds a `RecordedSession`
(app/recorded.py) and the live Session waits under LIVE_KEY until the recording is closed.
"""

from __future__ import annotations

import datetime as _dt
import html

import streamlit as st

from app.i18n import STRINGS, language_selector, t
from app.live import SESSION_KEY, get_session
from app.recorded import (
    RECORDING_LACKS,
    RecordedSession,
    bundled_recordings,
    describe,
    open_recording,
    session_recording,
    session_trace,
)
from engine.recording import RecordingError

LIVE_KEY = "_servelab_live_session"
ERROR_KEY = "_recording_error"
SAVED_KEY = "_recording_bytes"
TRACE_KEY = "_trace_bytes"

STRINGS.update({
    "rec.header": {"zh": "录制", "en": "Recordings"},
    "rec.banner": {
        "zh": "▶ 正在回放录制（不是实时引擎）：{machine} · {date} · 模型 {model} · "
              "{batching} / {kv_layout} / 投机 {spec} · {seats} 个座位 · {blocks} 个块 · "
              "共 {steps} 步 · 来源 {source}",
        "en": "▶ Replaying a recording (not the live engine): {machine} · {date} · model "
              "{model} · {batching} / {kv_layout} / speculation {spec} · {seats} seats · "
              "{blocks} blocks · {steps} steps · from {source}"},
    "rec.source.app": {"zh": "本应用", "en": "this app"},
    "rec.source.engine": {"zh": "引擎", "en": "the engine"},
    "rec.source.class-server": {"zh": "课堂服务器", "en": "the class server"},
    "rec.source.gpu-check": {"zh": "GPU 检查", "en": "the GPU check"},
    "rec.upload": {"zh": "打开录制文件（.jsonl.gz）", "en": "Open a recording (.jsonl.gz)"},
    "rec.bundled": {"zh": "或打开自带的录制", "en": "or open a bundled recording"},
    "rec.open": {"zh": "打开", "en": "Open"},
    "rec.close": {"zh": "关闭录制，回到实时引擎", "en": "Close the recording, back to the live engine"},
    "rec.save": {"zh": "把本次运行保存为录制", "en": "Save this run as a recording"},
    "rec.download": {"zh": "下载录制文件", "en": "Download the recording"},
    "rec.trace": {"zh": "下载为 trace（Perfetto、chrome://tracing 可打开）",
                  "en": "Download as a trace (opens in Perfetto, chrome://tracing)"},
    "rec.nothing": {"zh": "还没有可保存的步：先单步运行。", "en": "Nothing to save yet: step the run first."},
    "rec.error": {"zh": "无法打开这个文件：{why}（{detail}）",
                  "en": "Cannot open this file: {why} ({detail})"},
    "rec.err.unreadable": {"zh": "文件读不出来", "en": "the file cannot be read"},
    "rec.err.not_gzip": {"zh": "它不是 gzip 压缩的 ServeLab 录制文件",
                         "en": "it is not a gzip-compressed ServeLab recording"},
    "rec.err.damaged": {"zh": "压缩数据已损坏", "en": "its compressed data is damaged"},
    "rec.err.too_large": {"zh": "文件太大", "en": "the file is too large"},
    "rec.err.not_json": {"zh": "第一行不是 JSON", "en": "its first line is not JSON"},
    "rec.err.foreign": {"zh": "它不是 ServeLab 录制文件（文件头的类型不对）",
                        "en": "it is not a ServeLab recording (its header has another kind)"},
    "rec.err.version": {"zh": "录制文件的版本太新或不认识", "en": "its version is one this app does not read"},
    "rec.err.bad_line": {"zh": "文件里有一行不是步报告", "en": "a line in it is not a step report"},
    "rec.err.empty": {"zh": "文件里没有任何步报告", "en": "it holds no step reports"},
    "rec.lacks": {"zh": "这个录制里没有这一页要对比的运行（录制时没有跑这些设置）。",
                  "en": "This recording holds no run for what this page compares (those "
                        "settings were not run when it was recorded)."},
    "rec.prompt_off": {"zh": "回放录制时不能添加提示词。", "en": "A recording cannot take new prompts."},
})


def is_recording(session) -> bool:
    return isinstance(session, RecordedSession)


def error_text(exc: RecordingError) -> str:
    return t("rec.error", why=t(f"rec.err.{getattr(exc, 'code', 'bad_line')}"), detail=str(exc))


def banner_text(session: RecordedSession) -> str:
    facts = describe(session)
    facts["source"] = t(f"rec.source.{facts['source']}") if f"rec.source.{facts['source']}" in \
        STRINGS else facts["source"]
    return t("rec.banner", **facts)


def open_into_session(src, label: str = "") -> None:
    """Open a recording in this browser session (the live session waits); an error is kept
    for the sidebar to show."""
    try:
        recorded = open_recording(src, label)
        recorded.lacks_message = lacks_text
    except RecordingError as exc:
        st.session_state[ERROR_KEY] = error_text(exc)
        return
    current = st.session_state.get(SESSION_KEY)
    if current is not None and not is_recording(current):
        st.session_state[LIVE_KEY] = current
    st.session_state[SESSION_KEY] = recorded
    st.session_state.pop(ERROR_KEY, None)


def close_recording() -> None:
    live = st.session_state.pop(LIVE_KEY, None)
    if live is not None:
        st.session_state[SESSION_KEY] = live
    else:
        st.session_state.pop(SESSION_KEY, None)


def _open_chosen() -> None:
    upload = st.session_state.get("rec_upload")
    if upload is not None:
        open_into_session(upload.getvalue(), upload.name)
        return
    chosen = st.session_state.get("rec_bundled")
    if chosen:
        path = next((p for p in bundled_recordings() if p.name == chosen), None)
        if path is not None:
            open_into_session(path, path.name)


def _prepare_save() -> None:
    """The session's runs, once, as a recording and as a trace, for the two downloads."""
    session = get_session()
    try:
        st.session_state[SAVED_KEY] = session_recording(session)
        st.session_state[TRACE_KEY] = session_trace(session)
    except ValueError:
        st.session_state[SAVED_KEY] = st.session_state[TRACE_KEY] = None
        st.session_state[ERROR_KEY] = t("rec.nothing")


def recording_controls() -> None:
    """In the live sidebar: open a recording, or save this session's runs as one."""
    error = st.session_state.pop(ERROR_KEY, None)
    with st.sidebar.expander(t("rec.header"), expanded=error is not None):
        st.file_uploader(t("rec.upload"), type=["gz"], key="rec_upload")
        names = [p.name for p in bundled_recordings()]
        if names:
            st.selectbox(t("rec.bundled"), [""] + names, key="rec_bundled")
        st.button(t("rec.open"), key="rec_open", on_click=_open_chosen)
        if error:
            st.error(error)
        st.button(t("rec.save"), key="rec_save", on_click=_prepare_save)
        data = st.session_state.get(SAVED_KEY)
        if data:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M")
            st.download_button(t("rec.download"), data, file_name=f"servelab-{stamp}.jsonl.gz",
                               mime="application/gzip", key="rec_download")
            st.download_button(t("rec.trace"), st.session_state.get(TRACE_KEY) or b"",
                               file_name=f"servelab-{stamp}.trace.json",
                               mime="application/json", key="rec_trace")


def recording_shell(session: RecordedSession) -> None:
    """The shell while a recording is open: language, the label, Step / Play / Reset, close.
    No model is loaded and no engine is built."""
    from app.sidebar import _controls, _restore

    language_selector()
    _restore()
    st.sidebar.info(banner_text(session))
    _controls(session)
    st.sidebar.button(t("rec.close"), key="rec_close", on_click=close_recording)
    st.sidebar.caption(t("rec.prompt_off"))
    # every page carries the label above its own title
    st.html(f'<div class="servelab-recording" style="padding:.5rem .8rem;border-radius:.4rem;'
            f'background:#fff4d6;border:1px solid #e0b84c;font-weight:600">'
            f'{html.escape(banner_text(session))}</div>')


def lacks_text() -> str:
    return t("rec.lacks")


__all__ = ["RECORDING_LACKS", "is_recording", "open_into_session", "recording_controls",
           "recording_shell", "lacks_text"]
