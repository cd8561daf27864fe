"""What a server's Prometheus `/metrics` tells, for a class on a server with no step stream (a
vLLM or SGLang deployment, or `python -m engine.serve --no-step-stream`).

`parse_metrics(text)` reads the exposition text with prometheus_client's own parser and keeps
the figures the projector shows, under vLLM's names (both the v1 names and the older ones):

- running / waiting: `vllm:num_requests_running`, `vllm:num_requests_waiting` (summed over
  the label sets: one per model or engine);
- KV usage, a fraction in [0, 1]: `vllm:kv_cache_usage_perc` (v1) or
  `vllm:gpu_cache_usage_perc` (older), the mean over label sets;
- TTFT and ITL histograms: `vllm:time_to_first_token_seconds`, and
  `vllm:inter_token_latency_seconds` (v1) or `vllm:time_per_output_token_seconds` (older);
- generated tokens: `vllm:generation_tokens_total`.

Histograms are cumulative since the server started; `Histogram.since(previous)` gives what
happened between two reads, and `quantile(q)` interpolates inside a bucket as Prometheus's
`histogram_quantile` does. Pure: no streamlit (app/components/metrics_panel.py draws).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
GENERATED = ("vllm:generation_tokens", "vllm:generation_tokens_total")  # typed, untyped


class MetricsError(ValueError):
    """A /metrics answer that cannot be read; the message says what was wrong."""


@dataclass
class Histogram:
    """A cumulative histogram: upper bounds (seconds) and the count at or below each."""

    bounds: list[float]
    cumulative: list[float]
    sum: float = 0.0
    count: float = 0.0

    def since(self, prev: Histogram | None) -> Histogram:
        """What was observed after `prev` (the same buckets); self when prev is None or the
        server restarted (counts went down)."""
        if prev is None or prev.bounds != self.bounds or prev.count > self.count:
            return self
        return Histogram(self.bounds, [a - b for a, b in zip(self.cumulative, prev.cumulative)],
                         self.sum - prev.sum, self.count - prev.count)

    def quantile(self, q: float) -> float | None:
        """Prometheus's histogram_quantile: the bucket the q-th observation falls in, linear
        inside it; None with no observation. Past the last finite bound: that bound."""
        if not self.count or not self.bounds:
            return None
        rank = q * self.count
        lo_bound, lo_count = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative):
            if cum >= rank:
                if math.isinf(bound):
                    return lo_bound
                width = cum - lo_count
                frac = (rank - lo_count) / width if width else 1.0
                return lo_bound + (bound - lo_bound) * frac
            lo_bound, lo_count = bound, cum
        return lo_bound

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def bars(self) -> list[dict]:
        """Per bucket: its range and how many observations fell in it (not cumulative)."""
        out, prev_bound, prev_cum = [], 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative):
            out.append({"lo": prev_bound, "hi": bound, "count": cum - prev_cum})
            prev_bound, prev_cum = bound, cum
        return out


@dataclass
class MetricsSnapshot:
    """One read of /metrics: the projector's figures (None where the server has none)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # fraction in [0, 1]
    ttft: Histogram | None = None
    itl: Histogram | None = None
    generated_tokens: float | None = None
    models: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # figure -> the metric name found
    read_at: float = 0.0  # time.monotonic() of the read

    def tokens_per_s(self, prev: MetricsSnapshot | None) -> float | None:
        """Generated tokens per second between `prev` and this read."""
        if (prev is None or self.generated_tokens is None or prev.generated_tokens is None
                or self.read_at <= prev.read_at or self.generated_tokens < prev.generated_tokens):
            return None
        return (self.generated_tokens - prev.generated_tokens) / (self.read_at - prev.read_at)


def _histogram(family) -> Histogram | None:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for s in family.samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels.get("le", "nan"))
            if not math.isnan(le):
                buckets[le] = buckets.get(le, 0.0) + s.value
        elif s.name.endswith("_sum"):
            total += s.value
        elif s.name.endswith("_count"):
            count += s.value
    if not buckets:
        return None
    bounds = sorted(buckets)
    return Histogram(bounds, [buckets[b] for b in bounds], total, count)


def parse_metrics(text: str) -> MetricsSnapshot:
    """The projector's figures from Prometheus exposition text; MetricsError if it is not
    Prometheus text or holds none of vLLM's metrics."""
    if not isinstance(text, str):
        raise MetricsError("metrics must be text")
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"not Prometheus text: {exc}") from None
    snap = MetricsSnapshot(read_at=time.monotonic())
    models: set[str] = set()

    def first(names: tuple[str, ...]):
        for name in names:
            if name in families:
                return name, families[name]
        return None, None

    for attr, names in (("running", RUNNING), ("waiting", WAITING),
                        ("generated_tokens", GENERATED)):
        name, fam = first(names)
        if fam is not None:
            values = [s.value for s in fam.samples if s.name in (name, name + "_total")]
            setattr(snap, attr, sum(values) if values else None)
            snap.names[attr] = name
            models.update(s.labels.get("model_name", "") for s in fam.samples)
    name, fam = first(KV_USAGE)
    if fam is not None:
        values = [s.value for s in fam.samples if s.name == name]
        snap.kv_usage = sum(values) / len(values) if values else None
        snap.names["kv_usage"] = name
    for attr, names in (("ttft", TTFT), ("itl", ITL)):
        name, fam = first(names)
        if fam is not None:
            setattr(snap, attr, _histogram(fam))
            snap.names[attr] = name
    if not snap.names:
        raise MetricsError("no vLLM metrics (vllm:num_requests_running, ...) in this text: "
                           "is this a vLLM, SGLang or ServeLab server?")
    snap.models = sorted(m for m in models if m)
    return snap


def fetch_metrics(base_url: str, api_key: str | None = None, timeout: float = 5.0,
                  client=None) -> MetricsSnapshot:
    """GET <server>/metrics (the server root, with or without a trailing /v1) and parse it;
    MetricsError naming the URL when the server cannot be read."""
    import httpx

    root = base_url.rstrip("/").removesuffix("/v1")
    url = f"{root}/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        if client is not None:
            resp = client.get(url, headers=headers, timeout=timeout)
        else:
            resp = httpx.get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise MetricsError(f"cannot reach {url}: {exc}") from None
    if resp.status_code != 200:
        raise MetricsError(f"{url} answered HTTP {resp.status_code}")
    return parse_metrics(resp.text)
