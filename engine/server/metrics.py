"""Prometheus metrics of the server, under vLLM's names, so a Grafana board made for vLLM
reads ours.

Names as in vLLM v1 (`vllm/v1/metrics/loggers.py`), each labelled with `model_name`:
gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:num_requests_waiting_by_reason` (`reason`: capacity, deferred; they add up to the
waiting count), `vllm:kv_cache_usage_perc` (a fraction in [0, 1], as vLLM's); counters `vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`, `vllm:num_preemptions_total`, `vllm:request_success_total`
(by `finished_reason`), `vllm:spec_decode_num_drafts_total`,
`vllm:spec_decode_num_draft_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total`;
histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
`vllm:e2e_request_latency_seconds`. Ours: `servelab:requests_aborted_total`,
`servelab:request_errors_total` (a request that failed alone in the engine) and
`servelab:requests_rejected_total` (by HTTP status: 400, 413, 429...) and the gauge
`servelab:num_requests_waiting_by_code` (each waiting request's code this step, engine/waits.py:
seats_full, token_budget, kv_short, ...; they add up to the waiting count). The process collector
adds `process_resident_memory_bytes`, which the load generator reads before and after a run.

Each server owns its registry (not prometheus_client's global one), so several servers in
one process (the tests) do not collide. Only the stepping loop writes the engine figures.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from engine.waits import WAIT_CODES, waiting_by_reason

# no `*_created` timestamp series next to each counter (vLLM's endpoint has none either)
disable_created_metrics()

# vLLM's buckets for request latencies (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)
        lab = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch",
                             lab, registry=reg).labels(model_name)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled",
                             lab, registry=reg).labels(model_name)
        # vLLM's breakdown (capacity: queued for seats, budget or KV; deferred: held by a
        # transient constraint such as a LoRA budget or a KV transfer, which this engine has
        # none of), and this engine's own code for each waiting request (engine/waits.py)
        by_reason = Gauge("vllm:num_requests_waiting_by_reason",
                          "Requests waiting to be scheduled, by reason", lab + ["reason"],
                          registry=reg)
        self.waiting_by_reason = {r: by_reason.labels(model_name, r)
                                  for r in ("capacity", "deferred")}
        by_code = Gauge("servelab:num_requests_waiting_by_code",
                        "Requests waiting to be scheduled, by why they waited this step "
                        "(engine/waits.py)", lab + ["code"], registry=reg)
        self.waiting_by_code = {c: by_code.labels(model_name, c) for c in WAIT_CODES}
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage: fraction of blocks held, 1 = full",
                              lab, registry=reg).labels(model_name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens of admitted requests",
                                     lab, registry=reg).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens",
                                         "Generated tokens sent to clients",
                                         lab, registry=reg).labels(model_name)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions (by recompute)",
                                   lab, registry=reg).labels(model_name)
        self.success = Counter("vllm:request_success", "Finished requests, by finish reason",
                               ["model_name", "finished_reason"], registry=reg)
        self.model_name = model_name
        self.num_drafts = Counter("vllm:spec_decode_num_drafts", "Verified drafts",
                                  lab, registry=reg).labels(model_name)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Drafted tokens",
                                    lab, registry=reg).labels(model_name)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens",
                                       "Drafted tokens the target accepted",
                                       lab, registry=reg).labels(model_name)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token",
                              lab, buckets=TTFT_BUCKETS, registry=reg).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between token deliveries",
                             lab, buckets=ITL_BUCKETS, registry=reg).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token",
                             lab, buckets=E2E_BUCKETS, registry=reg).labels(model_name)
        self.aborted = Counter("servelab:requests_aborted", "Requests aborted (client gone)",
                               lab, registry=reg).labels(model_name)
        self.errors = Counter("servelab:request_errors",
                              "Requests that failed alone in the engine (their own sampling or "
                              "detokenizing raised); the others went on",
                              lab, registry=reg).labels(model_name)
        self.rejected = Counter("servelab:requests_rejected",
                                "Requests refused before reaching the engine, by HTTP status",
                                ["model_name", "status"], registry=reg)

    def on_step(self, report) -> None:
        """Engine-wide figures of one step (the loop thread), all from its StepReport: the
        gauges (running, waiting, KV usage) and the counters. The report's `failures` are
        among its aborted requests: they count as errors, not as aborts."""
        self.running.set(report.num_running)
        self.waiting.set(len(report.waiting))
        self.waiting_by_reason["capacity"].set(len(report.waiting))
        self.waiting_by_reason["deferred"].set(0)
        for code, n in waiting_by_reason(report.waits, report.waiting).items():
            self.waiting_by_code[code].set(n)
        self.kv_usage.set(report.kv_usage)
        num_failed = len(report.failures)
        self.preemptions.inc(len(report.preempted))
        self.aborted.inc(len(report.aborted) - num_failed)
        self.errors.inc(num_failed)
        for rec in report.spec:
            self.num_drafts.inc()
            self.draft_tokens.inc(len(rec.drafted))
            self.accepted_tokens.inc(rec.num_accepted)

    def on_finish(self, reason: str) -> None:
        self.success.labels(self.model_name, reason).inc()

    def on_reject(self, status: int) -> None:
        self.rejected.labels(self.model_name, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
