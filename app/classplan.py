"""The class plan: chapter 6.4 as eight stops of a 45-minute class, each with its question, the
knobs its demo needs and a prediction the students commit to before the engine answers it.

A stop names every knob of the sidebar (`KNOBS`), so its "set up this demo" button leaves
nothing from the previous stop behind. A prediction's choices are ranges; `measure` reads
the runs the page drew (their settings and StepReport dicts) and returns the measured value
and the index of the range it falls in, or None while the runs are not done. So the right
answer is whatever this machine measures, never a number written down in advance.

Pure Python, no streamlit: the class plan page, the live pages and the tests read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from app.components.gauges import summary
from app.components.kvmap import kv_stats
from app.components.seats import seat_use
from app.components.spec_strip import spec_summary
from app.lessons import Text
from app.pagelist import page_info
from app.state import Settings

# The sidebar's knobs a stop sets: every field of Settings but the model.
KNOBS = tuple(f.name for f in fields(Settings) if f.name != "model")

# A run as the measurements see it: its Settings, its reports, whether it is done.
RunView = tuple[Settings, list[dict], bool]


@dataclass(frozen=True)
class Prediction:
    """A question with ranges for choices; `measure` says which range the engine landed in."""

    question: Text
    choices: tuple[Text, ...]
    bounds: tuple[float, ...]  # choice i holds values below bounds[i]; the last holds the rest
    measure: Callable[[list[RunView], dict], float | None]  # the value, None until done
    value_fmt: str = "{:.2f}"

    def __post_init__(self):
        if len(self.bounds) != len(self.choices) - 1 or list(self.bounds) != sorted(self.bounds):
            raise ValueError("a prediction needs one increasing bound between each two choices")

    def reveal(self, runs: list[RunView], extra: dict | None = None) -> tuple[float, int] | None:
        """(measured value, index of its choice), or None while there is nothing to show."""
        value = self.measure(runs, extra or {})
        if value is None:
            return None
        return value, sum(value >= b for b in self.bounds)


@dataclass(frozen=True)
class Stop:
    """One stop of the class: minutes, page, question, the knobs its demo needs, what to say."""

    id: str
    minutes: int
    page: str
    title: Text
    question: Text
    knobs: dict
    prediction: Prediction | None = None

    def __post_init__(self):
        page_info(self.page)  # raises for an unknown page
        if set(self.knobs) != set(KNOBS):
            raise ValueError(f"stop {self.id}: knobs must name exactly {KNOBS}; "
                             f"missing {sorted(set(KNOBS) - set(self.knobs))}, "
                             f"unknown {sorted(set(self.knobs) - set(KNOBS))}")

    @property
    def settings(self) -> Settings:
        return Settings(**self.knobs)


def _T(zh: str, en: str) -> Text:
    return Text(zh=zh, en=en)


def _knobs(**changes) -> dict:
    base = {name: getattr(Settings(), name) for name in KNOBS}
    unknown = set(changes) - set(base)
    if unknown:
        raise ValueError(f"unknown knobs {sorted(unknown)}; knobs are {KNOBS}")
    return {**base, **changes}


def _done(runs: list[RunView]) -> bool:
    return bool(runs) and all(done and hist for _, hist, done in runs)


def _one(runs: list[RunView], **match) -> list[dict] | None:
    for settings, hist, _ in runs:
        if all(getattr(settings, k) == v for k, v in match.items()):
            return hist
    return None


# ---------------------------------------------------------------- the measurements


def race_ratio(runs: list[RunView], extra: dict) -> float | None:
    """The home race: engine tokens/s ÷ naive server tokens/s."""
    result = extra.get("race")
    return None if not result or result.get("ratio") is None else result["ratio"]


def static_waste(runs: list[RunView], extra: dict) -> float | None:
    """Share of the static bus's seat-steps held by finished riders."""
    hist = _one(runs, batching="static")
    if not _done(runs) or hist is None:
        return None
    use = seat_use(hist)
    return use["idle-finished"] / use["total"] if use["total"] else 0.0


def steps_ratio(runs: list[RunView], extra: dict) -> float | None:
    """Steps continuous batching took ÷ steps static batching took, for the same work."""
    cont, stat = _one(runs, batching="continuous"), _one(runs, batching="static")
    if not _done(runs) or not cont or not stat:
        return None
    return len(cont) / len(stat)


def concurrency_ratio(runs: list[RunView], extra: dict) -> float | None:
    """Most requests holding KV at once: paged ÷ contiguous, same KV budget."""
    paged, cont = _one(runs, kv_layout="paged"), _one(runs, kv_layout="contiguous")
    if not _done(runs) or not paged or not cont:
        return None
    peak = [max(kv_stats(r["kv"])["requests"] for r in h) for h in (paged, cont)]
    return peak[0] / max(1, peak[1])


def contiguous_useful(runs: list[RunView], extra: dict) -> float | None:
    """Useful KV of the contiguous layout, averaged over the steps that held any."""
    hist = _one(runs, kv_layout="contiguous")
    if not _done(runs) or not hist:
        return None
    fracs = [r["kv"]["useful_frac"] for r in hist if r["kv"]["allocated_slots"]]
    return sum(fracs) / len(fracs) if fracs else None


def tokens_per_pass(runs: list[RunView], extra: dict) -> float | None:
    """Tokens each verification emitted, on average (the speculating run)."""
    for settings, hist, _ in runs:
        if settings.spec != "off" and _done(runs):
            return spec_summary(hist)["tokens_per_pass"]
    return None


def spec_speedup(runs: list[RunView], extra: dict) -> float | None:
    """Tokens/s with speculation ÷ without, same workload, stepped together."""
    on = next((h for s, h, _ in runs if s.spec != "off"), None)
    off = next((h for s, h, _ in runs if s.spec == "off"), None)
    if not _done(runs) or not on or not off:
        return None
    a, b = summary(on)["tokens_per_s"], summary(off)["tokens_per_s"]
    return a / b if b else None


# ---------------------------------------------------------------- the stops

STOPS: tuple[Stop, ...] = (
    Stop("race", 5, "home",
         _T("同一台机器，换个服务方式", "Same machine, another way to serve"),
         _T("服务方式能让同一台机器多服务几倍的 token？",
            "How much more can the same machine serve, just by serving differently?"),
         _knobs(),
         Prediction(
             _T("引擎的吞吐是朴素服务的几倍？", "The engine's throughput, as a multiple of the naive server's?"),
             (_T("差不多（不到 1.5 倍）", "About the same (under 1.5x)"),
              _T("1.5 到 3 倍", "1.5x to 3x"),
              _T("3 倍以上", "3x or more")),
             (1.5, 3.0), race_ratio, "×{:.2f}")),
    Stop("bus", 6, "batching",
         _T("旅游大巴：做完的人还占着座", "Tour bus: finished riders keep their seats"),
         _T("静态批处理里，座位的时间有多少花在已经答完的请求上？",
            "In static batching, how much seat time goes to requests that are already done?"),
         _knobs(batching="static", kv_layout="paged", workload="longtail", num_requests=16),
         Prediction(
             _T("静态大巴的座位·步里，被已完成乘客占着的比例？",
                "Of the static bus's seat-steps, the share held by finished riders?"),
             (_T("不到 15%", "Under 15%"), _T("15% 到 40%", "15% to 40%"),
              _T("40% 以上", "40% or more")),
             (0.15, 0.40), static_waste, "{:.0%}")),
    Stop("uniform", 5, "batching",
         _T("回答一样长时呢？", "And when every answer is as long?"),
         _T("如果所有回答一样长，连续批处理还省步数吗？",
            "If every answer has the same length, does continuous batching still save steps?"),
         _knobs(batching="continuous", kv_layout="paged", workload="uniform", num_requests=16),
         Prediction(
             _T("连续批处理用的步数 ÷ 静态用的步数？", "Steps continuous took ÷ steps static took?"),
             (_T("明显更少（不到 0.8）", "Clearly fewer (under 0.8)"),
              _T("差不多（0.8 到 1.05）", "About the same (0.8 to 1.05)"),
              _T("更多（1.05 以上）", "More (over 1.05)")),
             (0.8, 1.05), steps_ratio)),
    Stop("hall", 6, "paging",
         _T("宴会厅：按最长可能整块预留", "Banquet hall: reserve for the longest case"),
         _T("同样的 KV 预算，分页能同时装下多少倍的请求？",
            "With the same KV budget, how many times as many requests fit at once when paged?"),
         _knobs(batching="continuous", kv_layout="contiguous", workload="longtail",
                num_requests=16, seats=16, num_blocks=64, block_size=16),
         Prediction(
             _T("同时持有 KV 的请求数：分页 ÷ 整块预留？",
                "Requests holding KV at once: paged ÷ contiguous?"),
             (_T("一样（不到 1.3 倍）", "The same (under 1.3x)"), _T("1.3 到 2.5 倍", "1.3x to 2.5x"),
              _T("2.5 倍以上", "2.5x or more")),
             (1.3, 2.5), concurrency_ratio, "×{:.2f}")),
    Stop("waste", 5, "paging",
         _T("预留了，却没写进 token", "Reserved, never written"),
         _T("整块预留时，占着的显存里有多少真的存着 token？",
            "With contiguous reservations, how much of the held memory holds real tokens?"),
         _knobs(batching="continuous", kv_layout="contiguous", workload="longtail",
                num_requests=16, seats=8, num_blocks=128, block_size=16),
         Prediction(
             _T("整块预留的有效 KV（各步平均）？", "Useful KV of the contiguous layout (mean over steps)?"),
             (_T("不到 40%", "Under 40%"), _T("40% 到 75%", "40% to 75%"),
              _T("75% 以上", "75% or more")),
             (0.40, 0.75), contiguous_useful, "{:.0%}")),
    Stop("draft", 6, "speculation",
         _T("先起草，后验证", "Draft, then verify"),
         _T("照抄型回答里，一次目标前向能产出几个 token？",
            "On answers that copy the prompt, how many tokens does one target pass yield?"),
         _knobs(batching="continuous", kv_layout="paged", spec="ngram", k=4,
                workload="grounded", num_requests=4, temperature=0.0),
         Prediction(
             _T("每次目标前向平均产出的 token？", "Tokens per target pass, on average?"),
             (_T("约 1 个（不到 1.3）", "About 1 (under 1.3)"), _T("1.3 到 2.5 个", "1.3 to 2.5"),
              _T("2.5 个以上", "2.5 or more")),
             (1.3, 2.5), tokens_per_pass)),
    Stop("load", 6, "dashboard",
         _T("满载时还划算吗？", "Does it still pay at full load?"),
         _T("座位坐满时，开投机还能加速吗？",
            "With every seat taken, does speculation still speed things up?"),
         _knobs(batching="continuous", kv_layout="paged", spec="ngram", k=4, seats=16,
                num_blocks=128, workload="open", num_requests=32, temperature=0.0),
         Prediction(
             _T("开投机的吞吐 ÷ 不开的吞吐？", "Tokens/s with speculation ÷ without?"),
             (_T("更慢（不到 0.95）", "Slower (under 0.95)"), _T("差不多（0.95 到 1.2）", "About the same (0.95 to 1.2)"),
              _T("更快（1.2 以上）", "Faster (1.2 or more)")),
             (0.95, 1.2), spec_speedup, "×{:.2f}")),
    Stop("wrap", 6, "summary",
         _T("回顾与自测", "Summary and self-test"),
         _T("三处漏洞各由哪个补丁堵上，各改善了什么？",
            "Which patch closes each leak, and what does each improve?"),
         _knobs()),
)


# The chapter's summary in our words, each point with the stops that showed it.
SUMMARY: tuple[tuple[Text, tuple[str, ...]], ...] = (
    (_T("朴素服务漏在两处：静态批里答完的请求还占着座位；KV 显存按最长情况整块预留，又被切成碎片。",
        "Naive serving leaks in two places: in a static batch finished requests keep their "
        "seats, and KV memory is reserved whole for the longest case, then fragmented."),
     ("bus", "waste")),
    (_T("连续批处理每一步都重新排座：有人下车，门口的人马上补上，座位一直有人在算。",
        "Continuous batching reseats at every step: whoever finishes leaves, the next in the "
        "queue boards at once, and the seats keep computing."),
     ("bus", "uniform")),
    (_T("分页注意力（PagedAttention）把 KV 切成固定大小的块，用块表按需分配，浪费只剩每个请求最后一块没写满的部分。",
        "PagedAttention cuts KV into fixed-size blocks handed out on demand through a block "
        "table; the only waste left is each request's last, partly filled block."),
     ("waste", "hall")),
    (_T("省下的显存就是多装下的请求：同一预算里同时跑的请求越多，吞吐越高。",
        "Memory saved is requests admitted: more requests running in the same budget is "
        "more throughput."),
     ("hall", "race")),
    (_T("投机解码让便宜的提议者先猜几个 token，大模型一次前向全部验证；按接受规则，输出分布与大模型自己生成时相同。",
        "Speculative decoding lets a cheap proposer guess a few tokens and the big model "
        "verify them in one pass; with the acceptance rule the output follows the big "
        "model's own distribution."),
     ("draft",)),
    (_T("前两招提吞吐，服务器越满越值；投机解码降单个请求的延迟，机器越闲越值，满载时收益会缩水甚至变负。",
        "The first two fixes raise throughput and pay most on a full server; speculation "
        "cuts one request's latency and pays most on an idle one, shrinking or turning "
        "negative at full load."),
     ("draft", "load")),
)


def stop_by_id(stop_id: str) -> Stop:
    for stop in STOPS:
        if stop.id == stop_id:
            return stop
    raise ValueError(f"unknown stop {stop_id!r}; stops are {[s.id for s in STOPS]}")


def stops_for(page: str) -> list[Stop]:
    return [s for s in STOPS if s.page == page]
