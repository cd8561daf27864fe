"""When the class outgrows a laptop: the projector reads a server's /metrics (vLLM's names)
where no step stream exists. Against a /metrics text in vLLM's documented format (older
names), and against this project's own server run with its step stream off, which also
records its steps (the class server's `--record`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.remote_metrics import Histogram, MetricsError, fetch_metrics, parse_metrics
from engine.recording import Recorder, read_recording
from engine.server import ServerSettings
from tests.conftest import running_server

VLLM_TEXT = (Path(__file__).resolve().parent / "fixtures" / "vllm_metrics.txt").read_text()


def test_vllm_documented_text_reads_running_waiting_kv_and_histograms():
    snap = parse_metrics(VLLM_TEXT)
    assert snap.running == 37 and snap.waiting == 5
    assert snap.kv_usage == pytest.approx(0.8125)
    assert snap.names["kv_usage"] == "vllm:gpu_cache_usage_perc"
    assert snap.names["itl"] == "vllm:time_per_output_token_seconds"
    assert snap.models == ["Qwen/Qwen2.5-7B-Instruct"]
    assert snap.generated_tokens == 40960
    assert snap.ttft.count == 256 and snap.ttft.sum == pytest.approx(52.75)
    # the 128th of 256 first tokens lies in the (0.1, 0.25] bucket: 100 at or below 0.1,
    # 180 at or below 0.25, so 28/80 of the way through it
    assert snap.ttft.quantile(0.5) == pytest.approx(0.1 + 0.15 * 28 / 80)
    assert 0.01 < snap.itl.quantile(0.5) <= 0.05
    bars = snap.ttft.bars()
    assert sum(b["count"] for b in bars) == 256 and bars[-1]["hi"] == float("inf")


def test_histogram_since_and_quantile_edges():
    a = Histogram([0.1, 1.0, float("inf")], [1, 3, 4], 2.0, 4)
    b = Histogram([0.1, 1.0, float("inf")], [1, 5, 8], 9.0, 8)
    d = b.since(a)
    assert d.cumulative == [0, 2, 4] and d.count == 4 and d.sum == 7.0
    assert b.since(Histogram([0.1, 1.0, float("inf")], [9, 9, 9], 1, 9)) is b  # a restart
    assert Histogram([1.0], [0], 0, 0).quantile(0.5) is None
    assert a.quantile(1.0) == 1.0  # the last observation is past 1.0: that bound


@pytest.mark.parametrize("text", ["", "hello world {", "# TYPE x gauge\nx 1\n"])
def test_text_without_vllm_metrics_is_a_clear_error(text):
    with pytest.raises(MetricsError):
        parse_metrics(text)


def test_an_unreachable_server_names_its_url():
    with pytest.raises(MetricsError, match=r"127\.0\.0\.1:9/metrics"):
        fetch_metrics("http://127.0.0.1:9/v1", timeout=2)


@pytest.mark.slow
def test_own_server_without_step_stream_feeds_the_metrics_reader(engine, tmp_path):
    """--no-step-stream: the step stream answers 404 (OpenAI's error body), /metrics carries
    the figures; the server's recorder keeps every step with who asked."""
    path = tmp_path / "class.jsonl.gz"
    rec = Recorder(path, engine.config, source="class-server")
    with running_server(engine, ServerSettings(step_stream=False)) as (url, app):
        app.state.loop.recorder = rec
        with httpx.Client(timeout=60) as client:
            r = client.get(f"{url}/v1/servelab/steps")
            assert r.status_code == 404 and "no-step-stream" in r.json()["error"]["message"]
            before = fetch_metrics(url + "/v1", client=client)
            assert before.running == 0 and before.names["kv_usage"] == "vllm:kv_cache_usage_perc"
            for user in ("小明", "amy"):
                body = {"model": "smollm2-135m", "prompt": "The sky is", "max_tokens": 5,
                        "temperature": 0, "user": user}
                resp = client.post(f"{url}/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
            after = fetch_metrics(url, client=client)
        app.state.loop.recorder = None
    rec.close()
    assert after.ttft.count - (before.ttft.count if before.ttft else 0) == 2
    assert after.itl.since(before.itl).count >= 2 * 3  # 4 gaps per answer, tokens may batch
    assert after.generated_tokens - (before.generated_tokens or 0) == 10
    assert after.ttft.quantile(0.5) > 0
    assert after.names["itl"] == "vllm:inter_token_latency_seconds"
    replay = read_recording(path)
    assert replay.source == "class-server" and replay.runs[0]
    assert {o["user"] for o in replay.owners.values()} == {"小明", "amy"}
    emitted = sum(len(e["token_ids"]) for r in replay.runs[0] for e in r["emitted"])
    assert emitted == 10


def _panel_from_fixture(lang: str) -> None:
    import pathlib

    import streamlit as st

    from app.components.metrics_panel import metrics_panel
    from app.remote_metrics import parse_metrics

    st.session_state["lang"] = lang
    text = (pathlib.Path("tests/app/fixtures/vllm_metrics.txt")).read_text()
    metrics_panel(parse_metrics(text))


@pytest.mark.parametrize("lang, running, header", [("en", "Running", "no step stream"),
                                                   ("zh", "运行中", "没有逐步数据流")])
def test_the_panel_draws_vllm_metrics_in_both_languages(lang, running, header):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_panel_from_fixture, args=(lang,), default_timeout=60).run()
    assert not at.exception, at.exception[0].value
    shown = {m.label: m.value for m in at.metric}
    assert shown[running] == "37" and "81%" in shown.values()
    assert any(header in s.value for s in at.subheader)
    assert any("p50 15" in c.value for c in at.caption)  # TTFT p50: about 152 ms, buckets


def _panel_from_server(url: str) -> None:
    import streamlit as st

    from app.components.metrics_panel import server_metrics_view

    st.session_state["lang"] = "en"
    server_metrics_view(url, {})


def test_the_panel_reads_an_unreachable_server_as_an_error_line():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_panel_from_server, args=("http://127.0.0.1:9",),
                               default_timeout=60).run()
    assert not at.exception
    assert "Cannot read the server's metrics" in at.error[0].value
