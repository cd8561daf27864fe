"""The dashboard's gauges (tokens/s, TTFT, TPOT, ITL, seats busy, KV used, acceptance, tokens
per target pass) and their history.

Pure functions of a run's StepReport dicts. Latencies are measured on the engine's clock:
the sum of the measured step times, so the pauses while a teacher talks between two clicks
do not count. A request arrives at the clock reading before the first step that lists it
(the whole workload at 0, a custom prompt when it was typed in); its first token comes at
the end of the step that emitted it. TTFT = first token - arrival; TPOT = (last token -
first token) / (tokens - 1), as in engine/metrics.py. ITL, the inter-token latency, is the
gap between two consecutive deliveries of a request's tokens, one sample per delivery, as
streaming benchmarks measure it (vLLM's `bench serve`). Without speculation every step
delivers one token and the two agree; speculation delivers tokens in bursts, so TPOT falls
(more tokens over the same time) while ITL is about one speculative round (draft +
verify): the user sees the text
arrive in bigger jumps, not every jump sooner.
"""

from __future__ import annotations

import statistics

import pandas as pd

from app.i18n import t

# Streamlit cuts a metric's value and label that overflow their column with an ellipsis
# ("33.8 to…", "吞…"); on a projector the columns are narrow, so both wrap instead and the
# value's size follows the window.
METRIC_CSS = """<style>
[data-testid="stMetricValue"], [data-testid="stMetricValue"] > div, [data-testid="stMetricValue"] p,
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] p {
  white-space: normal !important; overflow: visible !important; text-overflow: clip !important;
  overflow-wrap: anywhere;}
[data-testid="stMetricValue"] {font-size: clamp(1.2rem, 2.1vw, 2.25rem) !important;
  line-height: 1.15;}
</style>"""

GAUGES = ("tokens_per_s", "ttft", "tpot", "itl", "seats_busy", "kv_used", "acceptance",
          "tokens_per_pass")


def _rids_in(rep: dict):
    yield from rep["waiting"]
    for seat in rep["seats"]:
        if seat["request_id"]:
            yield seat["request_id"]
    for e in rep["emitted"]:
        yield e["request_id"]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def history_frame(history: list[dict]) -> pd.DataFrame:
    """Per step: the gauge values (None where not defined yet), and the clock."""
    clock = 0.0
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    drafted = accepted = verifies = 0
    rows = []
    for rep in history:
        for rid in _rids_in(rep):
            arrival.setdefault(rid, clock)
        clock += rep["wall_s"]
        for e in rep["emitted"]:
            rid, n = e["request_id"], len(e["token_ids"])
            if not n:
                continue
            if rid not in first:
                first[rid] = clock
                ttfts.append(clock - arrival[rid])
            else:
                itls.append(clock - last[rid])
            last[rid] = clock
            count[rid] = count.get(rid, 0) + n
        for rid in rep["finished"]:
            if count.get(rid, 0) > 1:
                tpots.append((last[rid] - first[rid]) / (count[rid] - 1))
        for rec in rep.get("spec", []):
            drafted += len(rec["drafted"])
            accepted += rec["num_accepted"]
            verifies += 1
        m = rep.get("metrics", {})
        seats = len(rep["seats"]) or 1
        busy = sum(1 for s in rep["seats"] if s["state"] in ("running", "prefill"))
        ttft, tpot, itl = _median(ttfts), _median(tpots), _median(itls)
        rows.append({
            "step": rep["step"], "clock_s": clock,
            "tokens_per_s": m.get("tokens_per_s"),
            "ttft": None if ttft is None else ttft * 1000,
            "tpot": None if tpot is None else tpot * 1000,
            "itl": None if itl is None else itl * 1000,
            "seats_busy": busy / seats,
            "kv_used": rep["kv"]["used_slots"] / rep["kv"]["total_slots"],
            "kv_allocated": rep["kv"]["allocated_slots"] / rep["kv"]["total_slots"],
            "acceptance": accepted / drafted if drafted else None,
            # Every verification emits its accepted drafts and the target's own token.
            "tokens_per_pass": (accepted + verifies) / verifies if verifies else None,
        })
    return pd.DataFrame(rows, columns=["step", "clock_s", *GAUGES, "kv_allocated"])


def _fmt(key: str, value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    if key == "tokens_per_s":
        return f"{value:.1f}"
    if key in ("ttft", "tpot", "itl"):
        return f"{value:.0f} ms"
    if key == "tokens_per_pass":
        return f"{value:.2f}"
    return f"{100 * value:.0f}%"


def gauge_values(history: list[dict]) -> list[dict]:
    """The gauges now: key, translated label, formatted value, raw value, help text."""
    if not history:
        return [{"key": k, "label": t(f"gauge.{k}"), "value": "—", "raw": None,
                 "help": t(f"gauge.{k}.help")} for k in GAUGES]
    row = history_frame(history).iloc[-1].to_dict()
    last = history[-1]
    out = []
    for k in GAUGES:
        raw = row[k]
        raw = None if raw is None or raw != raw else raw
        value = _fmt(k, raw)
        if k == "seats_busy":
            busy = sum(1 for s in last["seats"] if s["state"] in ("running", "prefill"))
            value = f"{busy} / {len(last['seats'])}"
        if k == "kv_used":
            value = f"{_fmt(k, raw)} / {_fmt(k, row['kv_allocated'])}"
        out.append({"key": k, "label": t(f"gauge.{k}"), "value": value, "raw": raw,
                     "help": t(f"gauge.{k}.help")})
    return out


def summary(history: list[dict]) -> dict:
    """Whole-run figures for side-by-side comparisons: tokens, engine time, tokens/s."""
    tokens = sum(len(e["token_ids"]) for rep in history for e in rep["emitted"])
    busy_s = sum(rep["wall_s"] for rep in history)
    return {"steps": len(history), "tokens": tokens, "busy_s": busy_s,
            "tokens_per_s": tokens / busy_s if busy_s > 0 else 0.0,
            "tokens_per_step": tokens / len(history) if history else 0.0}
