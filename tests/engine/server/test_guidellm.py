"""A third-party load tool end to end: guidellm's CLI runs a concurrent benchmark (24 streams in
make test, 64 in make test-soak; synthetic prompts of a fixed token length, a fixed answer
length) against
`python -m engine.serve` started as its own process with its default flags, as a serving
engineer would run it: more streams than seats, so the server must queue them, not refuse.
Every request must succeed in full (none errored, none cut short, none answered 429 on a
loopback server without a key), each answer must have exactly the tokens asked for, and the
server's own /metrics counters must agree with guidellm's request and token counts.

guidellm counts tokens with the served model's tokenizer, read from the converted model's
folder: nothing is fetched from the hub."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

MODEL = "smollm2-135m"
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 32


def counter(metrics: str, name: str) -> float:
    """The sum of a Prometheus counter's samples over all its labels."""
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", metrics, re.M)
    assert found, f"{name} missing from /metrics"
    return sum(float(v) for v in found)


@pytest.fixture
def serve(tmp_path):
    """`python -m engine.serve` on a free loopback port, stopped by its pid."""
    from engine.model.loader import hf_folder

    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.serve", "--host", "127.0.0.1", "--port", str(port),
         "--model", MODEL],  # default flags
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # the first run may build the C++ kernels
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "engine.serve did not start in 300 s"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url, str(hf_folder(MODEL))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


# streams (all at once: more than engine.serve's 16 seats, so it must queue) and requests:
# make test's run, and make test-soak's
@pytest.mark.parametrize("streams,requests", [
    (24, 24), pytest.param(64, 64, marks=pytest.mark.soak)], ids=["24", "64"])
def test_guidellm_concurrent_all_succeed_and_metrics_agree(serve, tmp_path, streams, requests):
    url, tokenizer = serve
    out = tmp_path / "guidellm.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    cmd = [sys.executable, "-m", "guidellm", "run",
           "--backend", f"kind=openai_http,target={url},model={MODEL},"
                        "request_format=/v1/completions",
           "--profile", f"kind=concurrent,streams={streams}",
           "--constraint", f"kind=max_requests,count={requests}",
           # a bound on time only, so a hung server fails the test instead of stalling it
           "--constraint", "kind=max_duration,seconds=400",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
                     f"output_tokens={OUTPUT_TOKENS}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
           "--output", f"kind=json,path={out}",
           "--disable-console-interactive"]
    run = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=460)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    bench = json.loads(out.read_text())["benchmarks"]
    assert len(bench) == 1
    reqs = bench[0]["requests"]
    errors = [r.get("error") for r in reqs["errored"]]
    assert errors == [] and reqs["incomplete"] == [], errors[:3]
    ok = reqs["successful"]
    assert len(ok) == requests
    # exactly what was asked: the synthetic prompts are PROMPT_TOKENS long in the served
    # tokenizer, and ignore_eos + max_tokens make every answer OUTPUT_TOKENS long
    assert {r["prompt_tokens"] for r in ok} == {PROMPT_TOKENS}
    assert {r["output_tokens"] for r in ok} == {OUTPUT_TOKENS}
    assert all(r["time_to_first_token_ms"] > 0 for r in ok)

    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert counter(metrics, "vllm:request_success_total") == requests
    assert counter(metrics, "vllm:generation_tokens_total") == requests * OUTPUT_TOKENS
    assert counter(metrics, "vllm:prompt_tokens_total") == sum(r["prompt_tokens"] for r in ok)
    assert counter(metrics, "vllm:num_requests_running") == 0
    assert counter(metrics, "vllm:num_requests_waiting") == 0

    m = bench[0]["metrics"]
    print(f"guidellm concurrent@{streams}, {requests} requests, {PROMPT_TOKENS}+{OUTPUT_TOKENS}"
          f" tokens: {m['requests_per_second']['successful']['mean']:.2f} req/s, TTFT median "
          f"{m['time_to_first_token_ms']['successful']['median']:.0f} ms, ITL median "
          f"{m['inter_token_latency_ms']['successful']['median']:.0f} ms, output "
          f"{m['output_tokens_per_second']['successful']['mean']:.1f} tok/s")
