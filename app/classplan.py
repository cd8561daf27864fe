"""The class plan: chapter 6.4 as nine stops of a 45-minute class (about 40 minutes of stops,
the rest slack), each with its question, the knobs its demo needs and a prediction the
students commit to before the engine answers it.

A stop names every knob of the sidebar (`KNOBS`), so its "set up this demo" button leaves
nothing from the previous stop behind. A prediction's choices are ranges; `measure` reads
the runs the page drew (their settings and StepReport dicts) and returns the measured value
and the index of the range it falls in, or None while the runs are not done. So the right
answer is whatever this machine measures, never a number written down in advance; what is
written down is the range the chapter argues for (`Prediction.expect`), which
tests/app/test_stops.py checks by running every stop's preset headless.

Pure Python, no streamlit: the class plan page, the live pages and the tests read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

from app.components.gauges import history_frame, summary
from app.components.kvmap import kv_stats
from app.components.seats import seat_use
from app.components.spec_strip import spec_summary
from app.lessons import Text
from app.pagelist import page_info
from app.state import Settings
from engine.config import BATCHING, KV_LAYOUTS
from lessons.figures import figure_text

CLASS_MINUTES = 45  # one class; the stops take about 40 of it, the rest is slack

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
    # The range the chapter argues the value lands in on this preset, and why (shown to the
    # teacher; tests/app/test_stops.py runs the preset and checks the measurement is in it).
    expect: tuple[float, float] = (-math.inf, math.inf)
    why: Text | None = None
    # More of the same runs, in words: (zh, en) lines built from the runs, or None
    detail: Callable[[list[RunView], dict], Text | None] | None = None

    def __post_init__(self):
        if len(self.bounds) != len(self.choices) - 1 or list(self.bounds) != sorted(self.bounds):
            raise ValueError("a prediction needs one increasing bound between each two choices")
        if not self.expect[0] < self.expect[1]:
            raise ValueError("a prediction's expected range needs low < high")

    def expected(self, value: float) -> bool:
        return self.expect[0] <= value <= self.expect[1]

    def expect_text(self, lang: str) -> str:
        """The chapter's range in the value's own format: "≥ 1.5", "≤ 50%", "0.80 – 1.05"."""
        lo, hi = self.expect
        if math.isinf(hi):
            return "≥ " + self.value_fmt.format(lo)
        if math.isinf(lo):
            return "≤ " + self.value_fmt.format(hi)
        return f"{self.value_fmt.format(lo)} – {self.value_fmt.format(hi)}"

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

    @property
    def run_steps(self) -> int | None:
        """How many steps the stop's run takes to its end (RUN_STEPS), None where unknown."""
        return RUN_STEPS.get(self.id)

    @property
    def stride(self) -> int:
        """Engine steps a tick of Play advances on this stop: enough that the run ends within
        about PLAY_TICKS ticks (its minute on the projector), one where the run is short."""
        steps = self.run_steps
        return max(1, math.ceil(steps / PLAY_TICKS)) if steps else 1


# A stop's run fits its minute: at Play's default pace (app/sidebar.py PLAY_INTERVAL_S, 0.5 s)
# this many ticks are 50 s. A longer run advances several steps a tick (Stop.stride).
PLAY_TICKS = 100
# Each stop's run length in steps, measured headless (tests/app/test_stops.py checks it to
# within RUN_STEPS_SLACK: greedy tokens, so only a CPU whose rounding moves an EOS differs)
RUN_STEPS = {"bus": 72, "uniform": 96, "hall": 266, "waste": 123, "draft": 48, "quiet": 48,
             "load": 51}
RUN_STEPS_SLACK = 0.15


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


def paged_useful(runs: list[RunView]) -> float | None:
    hist = _one(runs, kv_layout="paged")
    fracs = [r["kv"]["useful_frac"] for r in hist or [] if r["kv"]["allocated_slots"]]
    return sum(fracs) / len(fracs) if fracs else None


def used_of_pool(runs: list[RunView], layout: str) -> float | None:
    """Slots holding tokens ÷ every slot of the KV pool, averaged over the steps that held
    any: the paper's ratio (token states ÷ all KV memory), where ours divides by held."""
    hist = _one(runs, kv_layout=layout)
    fracs = [r["kv"]["used_slots"] / r["kv"]["total_slots"] for r in hist or []
             if r["kv"]["allocated_slots"]]
    return sum(fracs) / len(fracs) if fracs else None


def waste_detail(runs: list[RunView], extra: dict) -> Text | None:
    """Stop "waste": paged next to contiguous, and the paper's ratio next to ours."""
    if not _done(runs):
        return None
    cont, paged = contiguous_useful(runs, extra), paged_useful(runs)
    pool = used_of_pool(runs, "contiguous")
    if cont is None or paged is None or pool is None:
        return None
    paper = {lang: figure_text("paper_useful_kv", lang) for lang in ("zh", "en")}
    return _T(
        f"整块预留：占着的槽位里 {cont:.0%} 存着 token；分页：{paged:.0%}。"
        f"按论文的算法（存着 token 的槽位 ÷ 整个 KV 池），整块预留是 {pool:.0%}。"
        "PagedAttention 论文（Kwon 等，SOSP 2023，图 2）在它重新实现的 Orca 系统上测得只有 "
        f"{paper['zh']} 的 KV 显存存着 token。两者不同在分母和条件：论文除以整块 KV 显存（含碎片），"
        "在 GPU 上用 OPT 模型和 ShareGPT、Alpaca 数据集的请求，按最大长度（Max）、2 的幂（Pow2）或事先知道的真实长度"
        "（Oracle）预留；这里除以请求占着的槽位，是 CPU 上的 135M 模型、这组问答、上限 256 个 token 的预留。",
        f"Contiguous: {cont:.0%} of the slots held hold a token; paged: {paged:.0%}. "
        f"Counted as the paper counts (slots holding tokens ÷ the whole KV pool), contiguous is "
        f"{pool:.0%}. The PagedAttention paper (Kwon et al., SOSP 2023, Fig. 2) measured only "
        f"{paper['en']} of KV memory holding token states in its re-implementations of Orca. The "
        "two differ in divisor and setting: the paper divides by all KV memory (fragments "
        "included), on GPUs with OPT models and requests from the ShareGPT and Alpaca "
        "datasets, reserving the maximum "
        "length (Max), a power of two (Pow2) or the true length known in advance (Oracle); here "
        "we divide by the slots requests hold, with a 135M model on a CPU, these questions and "
        "a 256-token reservation.")


def _latency(hist: list[dict]) -> tuple[float, float] | None:
    """(TTFT, TPOT) medians in ms over the run's finished requests, as the dashboard shows."""
    row = history_frame(hist).iloc[-1]
    if row["ttft"] != row["ttft"] or row["tpot"] != row["tpot"]:
        return None
    return float(row["ttft"]), float(row["tpot"])


def _on_off(runs: list[RunView]) -> tuple[list[dict], list[dict]] | None:
    on = next((h for s, h, _ in runs if s.spec != "off"), None)
    off = next((h for s, h, _ in runs if s.spec == "off"), None)
    if not _done(runs) or not on or not off:
        return None
    return on, off


def tpot_ratio(runs: list[RunView], extra: dict) -> float | None:
    """Median TPOT with speculation ÷ without, same workload, stepped together."""
    pair = _on_off(runs)
    if pair is None:
        return None
    on, off = _latency(pair[0]), _latency(pair[1])
    return None if on is None or off is None or not off[1] else on[1] / off[1]


def latency_detail(runs: list[RunView], extra: dict) -> Text | None:
    pair = _on_off(runs)
    if pair is None:
        return None
    on, off = _latency(pair[0]), _latency(pair[1])
    if on is None or off is None:
        return None
    tps = spec_speedup(runs, extra)
    speed = "" if tps is None else f" · ×{tps:.2f}"
    return _T(f"开投机：TTFT {on[0]:.0f} ms，TPOT {on[1]:.1f} ms；不开：TTFT {off[0]:.0f} ms，"
              f"TPOT {off[1]:.1f} ms（中位数，引擎时钟）。吞吐之比{speed or ' —'}。",
              f"Speculation on: TTFT {on[0]:.0f} ms, TPOT {on[1]:.1f} ms; off: TTFT "
              f"{off[0]:.0f} ms, TPOT {off[1]:.1f} ms (medians, engine clock). Tokens/s "
              f"ratio{speed or ' —'}.")


# ---------------------------------------------------------------- the stops

_LATENCY_CHOICES = (_T("明显更短（不到 0.9）", "Clearly shorter (under 0.9)"),
                    _T("差不多（0.9 到 1.1）", "About the same (0.9 to 1.1)"),
                    _T("更长（1.1 以上）", "Longer (1.1 or more)"))

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
             (1.5, 3.0), race_ratio, "×{:.2f}", expect=(2.0, math.inf),
             why=_T("章节：同一张卡换成真正的服务引擎，能多服务数倍的用户（它的“一个数量级”是和 GPU 上的 "
                    "HuggingFace 式服务相比）。在这台 CPU 上，长尾负载下至少应有 2 倍。比赛比的是两个完整的服务器，"
                    "倍数有几个来源：录制的那次里，引擎用朴素的策略（静态批、整块预留 KV）就已是 generate() 的 "
                    "{{figure:race_engine_naive_policies}}（它自己的算子每步读的字节更少），连续批处理再乘 "
                    "{{figure:race_continuous}}，分页在这个 KV 预算下是 {{figure:race_paged}}（显存紧时才见效：第 4 站）。",
                    "The chapter: the same card serves several times the users with a real serving "
                    "engine (its \"order of magnitude\" is against HuggingFace-style serving on a GPU). "
                    "On this CPU, on the long-tail workload, at least 2x. The race compares two "
                    "whole servers, so the multiple has several causes: on the recorded run the "
                    "engine with the naive policies (static batches, contiguous KV) is already "
                    "{{figure:race_engine_naive_policies}} generate() (its own kernels read fewer "
                    "bytes a step), continuous batching adds {{figure:race_continuous}} and paging "
                    "{{figure:race_paged}} at this KV budget (it pays when memory is short: stop 4)."))),
    Stop("bus", 5, "batching",
         _T("旅游大巴：做完的人还占着座", "Tour bus: finished riders keep their seats"),
         _T("静态批处理里，座位的时间有多少花在已经答完的请求上？",
            "In static batching, how much seat time goes to requests that are already done?"),
         _knobs(batching="static", kv_layout="paged", workload="longtail", num_requests=16),
         Prediction(
             _T("静态大巴的座位·步里，被已完成乘客占着的比例？",
                "Of the static bus's seat-steps, the share held by finished riders?"),
             (_T("不到 15%", "Under 15%"), _T("15% 到 40%", "15% to 40%"),
              _T("40% 以上", "40% or more")),
             (0.15, 0.40), static_waste, "{:.0%}", expect=(0.25, 1.0),
             why=_T("章节的第一处漏洞：答案长短不一时，静态批要等最长的那个，短的答完后座位空转。",
                    "The chapter's first leak: with answers of mixed length a static batch waits "
                    "for its longest, and the seats of the short ones idle."))),
    Stop("uniform", 4, "batching",
         _T("回答一样长时呢？", "And when every answer is as long?"),
         _T("如果所有回答一样长，连续批处理还省步数吗？",
            "If every answer has the same length, does continuous batching still save steps?"),
         _knobs(batching="continuous", kv_layout="paged", workload="uniform", num_requests=16),
         Prediction(
             _T("连续批处理用的步数 ÷ 静态用的步数？", "Steps continuous took ÷ steps static took?"),
             (_T("明显更少（不到 0.8）", "Clearly fewer (under 0.8)"),
              _T("差不多（0.8 到 1.05）", "About the same (0.8 to 1.05)"),
              _T("更多（1.05 以上）", "More (over 1.05)")),
             (0.8, 1.05), steps_ratio, expect=(0.8, 1.05),
             why=_T("对照实验：漏洞来自长短不一；长度一样时没有空座可补，两者步数差不多。",
                    "The control: the leak comes from mixed lengths; with equal lengths there is "
                    "no empty seat to refill, and both take about as many steps."))),
    Stop("hall", 5, "paging",
         _T("宴会厅：按最长可能整块预留", "Banquet hall: reserve for the longest case"),
         _T("同样的 KV 预算，分页能同时装下多少倍的请求？",
            "With the same KV budget, how many times as many requests fit at once when paged?"),
         _knobs(batching="continuous", kv_layout="contiguous", workload="chat",
                num_requests=16, seats=16, num_blocks=64, block_size=16),
         Prediction(
             _T("同时持有 KV 的请求数：分页 ÷ 整块预留？",
                "Requests holding KV at once: paged ÷ contiguous?"),
             (_T("一样（不到 1.3 倍）", "The same (under 1.3x)"), _T("1.3 到 2.5 倍", "1.3x to 2.5x"),
              _T("2.5 倍以上", "2.5x or more")),
             (1.3, 2.5), concurrency_ratio, "×{:.2f}", expect=(1.5, math.inf),
             why=_T("整块预留按提示词 + max_tokens 给每个请求留位；这组问答在 EOS 处早早结束，"
                    "分页只占真正写下的块，同样的预算能同时装下多得多的请求。",
                    "Contiguous reserves prompt + max_tokens for each request; these answers end "
                    "early at EOS, and paged holds only the blocks written, so the same budget "
                    "fits many more requests at once."))),
    Stop("waste", 5, "paging",
         _T("预留了，还没写进 token", "Reserved, not yet written"),
         _T("整块预留时，占着的显存里有多少真的存着 token？",
            "With contiguous reservations, how much of the held memory holds real tokens?"),
         _knobs(batching="continuous", kv_layout="contiguous", workload="chat",
                num_requests=16, seats=8, num_blocks=128, block_size=16),
         Prediction(
             _T("整块预留时，占着的槽位里存着 token 的比例（各步平均）？",
                "Contiguous: the share of held slots holding a token (mean over steps)?"),
             (_T("不到 40%", "Under 40%"), _T("40% 到 75%", "40% to 75%"),
              _T("75% 以上", "75% or more")),
             (0.40, 0.75), contiguous_useful, "{:.0%}", expect=(0.0, 0.5),
             why=_T("回答在 EOS 处结束，远不到 max_tokens。请求还在跑时，预留里的斜纹部分只是「还没写」："
                    "有的在等以后的 token（预留未用），有的等回答在 EOS 处停下就再也不会写入（内部碎片）；"
                    "哪些属于哪种，要到请求结束、整段预留一起释放时才知道。这种占着却空着的空间，"
                    "就是章节说的“{{figure:chapter_waste}} 以上被浪费”那类浪费，只是分母不同（见下）。"
                    "分页只剩每个请求最后一块没写满的部分。",
                    "Answers end at EOS far below max_tokens. While a request runs, the hatched "
                    "part of its reservation is not yet written: some of it waits for tokens still "
                    "to come (reserved), the rest will never be written once the answer stops at "
                    "EOS (internal fragmentation), and which is which is known only when the "
                    "request ends and its whole reservation is freed. Room held but empty is the "
                    "kind of waste behind the chapter's \"over {{figure:chapter_waste}} wasted\", though "
                    "counted over "
                    "another divisor (below). Paged leaves only each request's last, partly "
                    "filled block."),
             detail=waste_detail)),
    Stop("draft", 5, "speculation",
         _T("先起草，后验证", "Draft, then verify"),
         _T("照抄型回答里，一次目标前向能产出几个 token？",
            "On answers that copy the prompt, how many tokens does one target pass yield?"),
         _knobs(batching="continuous", kv_layout="paged", spec="ngram", k=4,
                workload="grounded", num_requests=4, temperature=0.0),
         Prediction(
             _T("每次目标前向平均产出的 token？", "Tokens per target pass, on average?"),
             (_T("约 1 个（不到 1.3）", "About 1 (under 1.3)"), _T("1.3 到 2.5 个", "1.3 to 2.5"),
              _T("2.5 个以上", "2.5 or more")),
             (1.3, 2.5), tokens_per_pass, expect=(1.8, math.inf),
             why=_T("提议者猜得准时，一次验证接受好几个草稿 token，再加目标自己的一个。",
                    "When the proposer guesses well, one verification accepts several drafted "
                    "tokens, plus the target's own one."))),
    Stop("quiet", 4, "dashboard",
         _T("只有一个人在问时", "When only one person is asking"),
         _T("机器很闲时，开投机能让每个 token 来得更快吗？",
            "On an idle machine, does speculation make each token come sooner?"),
         _knobs(batching="continuous", kv_layout="paged", spec="ngram", k=4, seats=8,
                workload="grounded", num_requests=1, temperature=0.0),
         Prediction(
             _T("TPOT：开投机 ÷ 不开？", "TPOT with speculation ÷ without?"),
             _LATENCY_CHOICES, (0.9, 1.1), tpot_ratio, expect=(0.0, 0.9),
             why=_T("章节：投机解码降的是单个请求的延迟，机器越闲越值。在 GPU 上，低负载时一步解码受内存带宽"
                    "限制，多验证几个 token 几乎不加时间。CPU 上不是这样：录制的基准里（Zen 4），k = 4 时一次验证要算 "
                    "5 个 token，约是单 token 步的 {{figure:verify_5}}（实测 4 个是 "
                    "{{figure:verify_4}}，8 个是 {{figure:verify_8}}），只有几乎不花时间、又多半猜对的草稿才赚得回来：n-gram 在照抄型回答上正是如此，"
                    "所以 TPOT 下降；TTFT（预填充）不受影响。",
                    "The chapter: speculation cuts one request's latency and pays most on an idle "
                    "machine. On a GPU at low load a decode step is bound by memory bandwidth and "
                    "verifying a few more tokens adds little time. Not on a CPU: in the recorded bench "
                    "(Zen 4) with k = 4 a verification covers 5 tokens and costs about "
                    "{{figure:verify_5}} a one-token step ({{figure:verify_4}} "
                    "measured for 4, {{figure:verify_8}} for 8), "
                    "so only drafts that cost almost nothing and are mostly right pay, as n-gram's are on answers that copy the prompt: "
                    "TPOT falls; TTFT (the prefill) does not change."),
             detail=latency_detail)),
    Stop("load", 4, "dashboard",
         _T("满载时还划算吗？", "Does it still pay at full load?"),
         _T("同样的照抄型请求坐满座位时，开投机还能缩短 TPOT 吗？",
            "With the same copying requests filling every seat, does speculation still cut TPOT?"),
         _knobs(batching="continuous", kv_layout="paged", spec="ngram", k=4, seats=16,
                num_blocks=256, workload="grounded", num_requests=16, temperature=0.0),
         Prediction(
             _T("TPOT：开投机 ÷ 不开？", "TPOT with speculation ÷ without?"),
             _LATENCY_CHOICES, (0.9, 1.1), tpot_ratio, expect=(0.95, math.inf),
             why=_T("章节：满载时一步已经算满，验证的额外 token 不再免费，投机的收益缩水，甚至倒亏。"
                    "在 CPU 上这一点来得更早（一次前向本来就受算力限制）；在 GPU 上要到大批量时才出现。",
                    "The chapter: at full load a step is already compute-bound, the extra verified "
                    "tokens are no longer free, and speculation's gain shrinks or becomes a slowdown. "
                    "On a CPU this comes sooner (a pass is compute-bound already); on a GPU only at "
                    "large batches."),
             detail=latency_detail)),
    Stop("wrap", 3, "summary",
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
    (_T("省下的显存就是多装下的请求：同一预算里能同时跑更多请求。在 GPU 上这就是更高的吞吐；在这台 CPU 上，同时跑的请求一多，多出来的主要是拉长 TPOT。",
        "Memory saved is requests admitted: more requests run at once in the same budget. "
        "On a GPU that is more throughput; on this CPU, once a few run, the extra requests "
        "mostly lengthen TPOT."),
     ("hall",)),
    (_T("投机解码让便宜的提议者先猜几个 token，大模型一次前向全部验证；按接受规则，输出分布与大模型自己生成时相同。",
        "Speculative decoding lets a cheap proposer guess a few tokens and the big model "
        "verify them in one pass; with the acceptance rule the output follows the big "
        "model's own distribution."),
     ("draft",)),
    (_T("前两招提吞吐，服务器越满越值；投机解码降单个请求的延迟，机器越闲越值，满载时收益会缩水，甚至倒亏。",
        "The first two fixes raise throughput and pay most on a full server; speculation "
        "cuts one request's latency and pays most on an idle one; at full load its gain "
        "shrinks or becomes a slowdown."),
     ("draft", "quiet", "load")),
)


# The runs each page draws for its settings `s`, stepped together (the pages call this, so a
# headless measurement runs exactly what the page shows).
def page_variants(page: str, s: Settings) -> list[Settings]:
    if page == "batching":
        return [s.with_(batching=m) for m in BATCHING]
    if page == "paging":
        return [s.with_(kv_layout=layout) for layout in KV_LAYOUTS]
    if page == "speculation":
        return [s if s.spec != "off" else s.with_(spec="ngram"), s.with_(spec="off")]
    if page == "dashboard":
        return [s] if s.spec == "off" else [s, s.with_(spec="off")]
    return [s]


def measure_headless(stop: Stop, max_steps: int = 2000, race=None) -> float | None:
    """Run `stop`'s preset as its page does, without a browser: the page's runs on one
    session, stepped together to the end, then the stop's own measurement. The home race is
    run by `race(settings)` (the page's race function), given by the caller."""
    if stop.prediction is None:
        return None
    if stop.page == "home":
        extra = {"race": race(stop.settings)} if race else {}
        return stop.prediction.measure([], extra)
    views, _steps = run_headless(stop, max_steps)
    return stop.prediction.measure(views, {})


def run_headless(stop: Stop, max_steps: int = 2000) -> tuple[list[RunView], int]:
    """`stop`'s page's runs on one session, stepped together to the end: their views and the
    steps that took (RUN_STEPS)."""
    from app.state import Session

    session = Session(settings=stop.settings)
    variants = page_variants(stop.page, stop.settings)
    runs = [session.run(v) for v in variants]
    while not all(r.done for r in runs):
        if session.tick >= max_steps:
            raise RuntimeError(f"stop {stop.id}: not done after {max_steps} steps")
        session.step()
        runs = [session.run(v) for v in variants]
    return [(r.settings, r.history, r.done) for r in runs], session.tick


def stop_by_id(stop_id: str) -> Stop:
    for stop in STOPS:
        if stop.id == stop_id:
            return stop
    raise ValueError(f"unknown stop {stop_id!r}; stops are {[s.id for s in STOPS]}")


def stops_for(page: str) -> list[Stop]:
    return [s for s in STOPS if s.page == page]
