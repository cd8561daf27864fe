"""`python -m benchmarks.load`: many simulated users against any OpenAI-compatible server.

    python -m engine.serve &                      # or any other OpenAI-compatible server
    python -m benchmarks.load --users 1000 --arrival poisson --rate 8 --json load.json

Each user sends one streamed `/v1/completions` request (prompt and answer length from a
workload name or a JSONL file, the format `python -m benchmarks.bench --workload-file`
reads), with `user` = "sim-<n>" so the server's step stream can tell simulated riders from
people. Arrivals: all at once, at a fixed rate, Poisson, or the file's own `arrival_s`.
A 429 is a deliberate refusal (queue full, or this user's limit): the user waits for
`Retry-After` and tries again, a bounded number of times. The run is bounded in count (one
request per user) and time (`--timeout`): it always stops by itself.

Measured at the client, as vLLM's `benchmark_serving.py` does: TTFT (send to first token),
ITL (gaps between streamed chunks), TPOT ((end - first token) / (tokens - 1)), end-to-end
latency, output tok/s and request/s over the run, requests by outcome. From the server's
`/metrics`, when it has one: `process_resident_memory_bytes` before and after (is memory
flat?), the KV usage at the end (any leaked blocks?) and the server's CPU seconds: output
tokens per CPU second (server plus this client) is a figure the other jobs of a shared
machine do not move, unlike tokens per wall second.

`--compare-offline` also runs the same requests through `benchmarks.common.run_engine` in this
process, before and after the HTTP run, on the server's own engine configuration
(`GET /v1/servelab/config`), while the server idles: the same workload in the same run,
offline against over HTTP, per wall second and per CPU second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.workloads import WorkItem, Workload, get_workload, load_jsonl, with_arrivals

ARRIVALS = ("all-at-once", "rate", "poisson", "file")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


@dataclass
class UserResult:
    user: str
    outcome: str = "ok"  # "ok", "http <status>", "stream error", "timeout", "connection error"
    asked_tokens: int = 0
    tokens: int = 0  # streamed token ids (or chunks, if the server sends no ids)
    streamed_ids: bool = False  # the chunks carried `token_ids` (ServeLab's and vLLM's do)
    usage_tokens: int | None = None  # `usage.completion_tokens` of the last chunk
    retries_429: int = 0
    sent: float | None = None  # last (successful) send
    first: float | None = None
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def count(self) -> int:
        """Output tokens: the server's `usage` count when it sent one, else the streamed count
        (a server that streams text without token ids, such as llama.cpp's, holds back a
        token that ends inside a UTF-8 character, so its chunks can be fewer than its tokens)."""
        return self.usage_tokens if self.usage_tokens is not None else self.tokens


def make_users(workload: Workload, users: int, arrival: str, rate: float | None,
               seed: int = 0) -> list[WorkItem]:
    """`users` items (the workload cycled), with arrival times."""
    items = [workload.items[i % len(workload.items)] for i in range(users)]
    if arrival == "file":
        return items
    if arrival == "rate":
        if not rate or rate <= 0:
            raise ValueError("--rate must be > 0 requests per second for --arrival rate")
        return [replace(it, arrival_s=i / rate) for i, it in enumerate(items)]
    wl = with_arrivals(replace(workload, items=items),
                       "poisson" if arrival == "poisson" else "all-at-once",
                       rate=rate if arrival == "poisson" else None, seed=seed)
    return wl.items


async def one_user(client, base: str, model: str, i: int, item: WorkItem, t0: float,
                   deadline: float, max_retries: int, headers: dict,
                   extra_body: dict | None = None) -> UserResult:
    res = UserResult(user=f"sim-{i}", asked_tokens=item.max_tokens)
    await asyncio.sleep(max(0.0, t0 + item.arrival_s - time.perf_counter()))
    body = {"model": model, "prompt": item.prompt, "max_tokens": item.max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "user": res.user, "ignore_eos": item.ignore_eos, "return_token_ids": True,
            **(extra_body or {})}
    import httpx

    while True:
        res.sent = time.perf_counter()
        try:
            async with client.stream("POST", f"{base}/completions", json=body,
                                     headers=headers) as r:
                if r.status_code == 429 and res.retries_429 < max_retries:
                    res.retries_429 += 1
                    wait = float(r.headers.get("retry-after", "1"))
                    # spread the retries so refused users do not come back as one wave
                    wait *= 0.5 + random.random()
                    if time.perf_counter() + wait > deadline:
                        res.outcome = "http 429"
                        return res
                    await asyncio.sleep(wait)
                    continue
                if r.status_code != 200:
                    res.outcome = f"http {r.status_code}"
                    res.error = (await r.aread()).decode(errors="replace")[:300]
                    return res
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        res.outcome, res.error = "stream error", str(obj["error"])[:300]
                        return res
                    if obj.get("usage"):
                        res.usage_tokens = obj["usage"].get("completion_tokens")
                    for c in obj.get("choices") or []:
                        res.streamed_ids = res.streamed_ids or "token_ids" in c
                        n = len(c["token_ids"]) if "token_ids" in c else int(bool(c.get("text")))
                        if n:
                            now = time.perf_counter()
                            res.first = res.first or now
                            res.chunk_times.append(now)
                            res.tokens += n
                res.end = time.perf_counter()
                return res
        except (httpx.HTTPError, OSError) as exc:
            res.outcome, res.error = "connection error", f"{type(exc).__name__}: {exc}"[:300]
            return res


async def run_load(base_url: str, items: list[WorkItem], model: str | None = None,
                   api_key: str | None = None, timeout_s: float = 1800.0,
                   max_retries: int = 100, progress: bool = True,
                   admin_key: str | None = None, extra_body: dict | None = None) -> dict:
    """Play `items` as users against base_url (".../v1"); the summary as a dict. The server's
    gauges (/metrics) are read with admin_key when the server has one (else with api_key).
    `extra_body`: fields added to every request (a server's own options)."""
    import httpx

    base = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=len(items) + 8, max_keepalive_connections=64)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        if model is None:
            r = await client.get(f"{base}/models", headers=headers)
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        gauge_headers = ({"Authorization": f"Bearer {admin_key}"} if admin_key else headers)
        before = await server_gauges(client, base, gauge_headers)
        if not before and progress:
            print("note: no gauges from the server's /metrics (a server started with an admin "
                  "key needs --admin-key or SERVELAB_ADMIN_KEY here)")
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        tasks = [asyncio.create_task(one_user(client, base, model, i, it, t0, deadline,
                                              max_retries, headers, extra_body))
                 for i, it in enumerate(items)]
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(tasks), unit="req", desc=f"{len(tasks)} users")
        pending = set(tasks)
        while pending and time.perf_counter() < deadline:
            done, pending = await asyncio.wait(
                pending, timeout=max(0.0, min(1.0, deadline - time.perf_counter())),
                return_when=asyncio.FIRST_COMPLETED)
            if bar is not None:
                bar.update(len(done))
        for t in pending:
            t.cancel()
        results = []
        for it, t in zip(items, tasks):
            if t.cancelled() or not t.done():
                results.append(UserResult(user="?", outcome="timeout",
                                          asked_tokens=it.max_tokens))
            else:
                results.append(t.result())
        if bar is not None:
            bar.close()
        wall = time.perf_counter() - t0
        client_cpu = time.process_time() - cpu0  # what this generator took from the machine
        after = {}
        if before:  # a server without /metrics gauges has nothing to wait for
            await asyncio.sleep(0.2)  # the server's last step publishes its gauges
            after = await server_gauges(client, base, gauge_headers)
    out = {**summarize(results, wall, before, after), "client_cpu_s": client_cpu}
    if "cpu_seconds_total" in before and "cpu_seconds_total" in after:
        # on a shared machine the wall clock also measures the other jobs; CPU time does not
        out["server_cpu_s"] = after["cpu_seconds_total"] - before["cpu_seconds_total"]
        out["tok_per_cpu_s"] = out["output_tokens"] / (out["server_cpu_s"] + client_cpu)
    return out


async def server_gauges(client, base: str, headers: dict) -> dict:
    """A few figures from the server's /metrics (empty if it has none)."""
    root = base[:-3] if base.endswith("/v1") else base
    try:
        r = await client.get(f"{root}/metrics", headers=headers)
        if r.status_code != 200:
            return {}
        from prometheus_client.parser import text_string_to_metric_families

        want = {"process_resident_memory_bytes": "rss_bytes",
                "vllm:kv_cache_usage_perc": "kv_cache_usage",
                "vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
                "vllm:generation_tokens": "generation_tokens_total",
                "vllm:prompt_tokens": "prompt_tokens_total",
                "process_cpu_seconds": "cpu_seconds_total"}
        out = {}
        for fam in text_string_to_metric_families(r.text):
            if fam.name in want:
                out[want[fam.name]] = sum(s.value for s in fam.samples
                                          if not s.name.endswith("_created"))
        return out
    except Exception:  # another server's /metrics may be absent or odd: not our figure
        return {}


def summarize(results: list[UserResult], wall: float, before: dict, after: dict) -> dict:
    ok = [r for r in results if r.outcome == "ok"]
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    ttft = [r.first - r.sent for r in ok if r.first]
    e2e = [r.end - r.sent for r in ok if r.end]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpot = [(r.end - r.first) / (r.count - 1) for r in ok if r.count > 1 and r.first]
    tokens = sum(r.count for r in ok)
    ms = {}
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        ms[f"{name}_p50_s"] = percentile(vals, 0.5)
        ms[f"{name}_p99_s"] = percentile(vals, 0.99)
    return {
        "users": len(results), "ok": len(ok), "outcomes": outcomes,
        "retries_429": sum(r.retries_429 for r in results),
        "users_refused_at_least_once": sum(1 for r in results if r.retries_429),
        # the tokens asked for, by `usage`, and by the streamed ids where the server sends ids
        "exact_tokens": sum(1 for r in ok if r.count == r.asked_tokens
                            and (r.tokens == r.count or not r.streamed_ids)),
        "output_tokens": tokens, "wall_s": wall,
        "output_tok_per_s": tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0, **ms,
        "server_before": before, "server_after": after,
        "errors": [r.error for r in results if r.error][:10],
    }


def print_summary(s: dict, offline: dict | None = None) -> None:
    def f(x, scale=1.0, unit=""):
        return "-" if x is None else f"{x * scale:.1f}{unit}"

    rows = [("users", s["users"]), ("ok", s["ok"]),
            ("outcomes", ", ".join(f"{k}: {v}" for k, v in sorted(s["outcomes"].items()))),
            ("429 retries (users refused)", f"{s['retries_429']} "
                                            f"({s['users_refused_at_least_once']})"),
            ("exactly the tokens asked", s["exact_tokens"]),
            ("output tokens", s["output_tokens"]), ("wall", f(s["wall_s"], unit=" s")),
            ("output tok/s", f(s["output_tok_per_s"])), ("requests/s", f(s["requests_per_s"]))]
    for m in ("ttft", "tpot", "itl", "e2e"):
        rows.append((f"{m.upper()} p50 / p99", f"{f(s[f'{m}_p50_s'], 1000)} / "
                                              f"{f(s[f'{m}_p99_s'], 1000)} ms"))
    b, a = s["server_before"], s["server_after"]
    if "rss_bytes" in b and "rss_bytes" in a:
        rows.append(("server RSS before / after", f"{b['rss_bytes'] / 2**20:.0f} / "
                                                  f"{a['rss_bytes'] / 2**20:.0f} MiB"))
    if "server_cpu_s" in s:
        rows.append(("CPU s: server / this client",
                     f"{s['server_cpu_s']:.1f} / {s['client_cpu_s']:.1f}"))
        rows.append(("tokens per CPU s (server + client)", f"{s['tok_per_cpu_s']:.1f}"))
    if "kv_cache_usage" in a:
        rows.append(("server KV usage after", f"{a['kv_cache_usage']:.1%}"))
    if offline:
        rows.append(("offline tok/s (before / after)",
                     f"{f(offline['before']['output_tok_per_s'])} / "
                     f"{f(offline['after']['output_tok_per_s'])}"))
        ratio = s["output_tok_per_s"] / offline["output_tok_per_s"]
        rows.append(("HTTP / offline, tok/s", f"{ratio:.1%}"))
        rows.append(("offline tokens per CPU s (before / after)",
                     f"{offline['before']['tok_per_cpu_s']:.1f} / "
                     f"{offline['after']['tok_per_cpu_s']:.1f}"))
        if "tok_per_cpu_s" in s:
            rows.append(("HTTP / offline, tokens per CPU s",
                         f"{s['tok_per_cpu_s'] / offline['tok_per_cpu_s']:.1%}"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def offline_run(base_url: str, items: list[WorkItem], api_key: str | None) -> dict:
    """The same requests through the server's engine configuration, in this process."""
    import httpx

    from benchmarks.common import run_engine
    from engine.config import EngineConfig, SpecConfig

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(f"{base_url.rstrip('/')}/servelab/config", headers=headers, timeout=30)
    r.raise_for_status()
    cfg = r.json()
    cfg.pop("plan", None)  # how the server's engine runs: this process resolves its own
    if cfg.get("spec"):
        cfg["spec"] = SpecConfig(**cfg["spec"])
    cpu0 = time.process_time()
    out = run_engine(EngineConfig(**cfg), Workload("load", "", "", items))
    out["cpu_s"] = time.process_time() - cpu0
    out["tok_per_cpu_s"] = out["output_tokens"] / out["cpu_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--base-url", default="http://127.0.0.1:8000/v1")
    a("--api-key", default=None)
    a("--admin-key", default=os.environ.get("SERVELAB_ADMIN_KEY"),
      help="read the server's /metrics with this key (default: $SERVELAB_ADMIN_KEY)")
    a("--model", default=None, help="default: the first of GET /v1/models")
    a("--users", type=int, default=100)
    a("--workload", default="longtail")
    a("--workload-file", default=None, help="JSONL lines {\"prompt\": ..., \"max_tokens\": ...}")
    a("--max-tokens-scale", type=float, default=1.0)
    a("--arrival", default="all-at-once", choices=ARRIVALS)
    a("--rate", type=float, default=None, help="requests/s for --arrival rate or poisson")
    a("--seed", type=int, default=0)
    a("--timeout", type=float, default=1800.0, help="seconds; then the run stops")
    a("--max-retries", type=int, default=100, help="429 retries per user")
    a("--compare-offline", action="store_true",
      help="first run the same requests offline on the server's engine config")
    a("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.users < 1 or args.timeout <= 0 or args.max_retries < 0:
        ap.error("--users must be >= 1, --timeout > 0, --max-retries >= 0")
    try:
        wl = (load_jsonl(args.workload_file) if args.workload_file else
              get_workload(args.workload, n=args.users, seed=args.seed,
                           max_tokens_scale=args.max_tokens_scale))
        items = make_users(wl, args.users, args.arrival, args.rate, args.seed)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    offline = None
    if args.compare_offline:
        # offline before and after the HTTP run: a shared machine's speed drifts, and the
        # pair brackets the HTTP figure (the ratio is taken against their mean)
        print("offline: the same requests through the server's engine config, no HTTP ...")
        before = offline_run(args.base_url, items, args.api_key)
    summary = asyncio.run(run_load(args.base_url, items, args.model, args.api_key,
                                   args.timeout, args.max_retries,
                                   admin_key=args.admin_key))
    if args.compare_offline:
        print("offline again, after the HTTP run ...")
        after = offline_run(args.base_url, items, args.api_key)
        offline = {"before": before, "after": after, "output_tok_per_s": (
            before["output_tok_per_s"] + after["output_tok_per_s"]) / 2,
            "tok_per_cpu_s": (before["tok_per_cpu_s"] + after["tok_per_cpu_s"]) / 2}
    print_summary(summary, offline)
    if args.json:
        out = {"args": vars(args), "workload": wl.name, "http": summary, "offline": offline}
        if offline:
            out["http_over_offline"] = summary["output_tok_per_s"] / offline["output_tok_per_s"]
            if "tok_per_cpu_s" in summary:
                out["http_over_offline_per_cpu_s"] = (summary["tok_per_cpu_s"]
                                                      / offline["tok_per_cpu_s"])
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if summary["ok"] == summary["users"] else 1


if __name__ == "__main__":
    sys.exit(main())
