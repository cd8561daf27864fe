"""The browser session's engines: build one from the switches, replay the workload, step it.

- `Settings`: everything the sidebar sets (the three switches, the sizes, the workload).
- `Run`: one `LLMEngine` built from one `Settings`, the session's workload added at its start,
  and the history of its `StepReport` dicts (the pages draw only these).
- `Session`: the runs a browser session has asked for, keyed by `Settings`, and one clock,
  `tick`. Step and Play advance the clock; a run catches up with it when a page draws it, so
  two runs drawn side by side (static next to continuous, contiguous next to paged) are always
  at the same step of the same workload. Changing a switch drops every run: the new engine
  replays the same workload from the start.

Streamlit-free on purpose: the shell keeps one `Session` in `st.session_state`, tests and
`app/bench_step.py` use it directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from benchmarks.workloads import WORKLOAD_NAMES, chat, get_workload
from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig

# The models a browser may pick: server-side configuration only (never a path from a browser).
MODELS = tuple(m for m in os.environ.get("SERVELAB_APP_MODELS", "smollm2-135m").split(",") if m)
NUM_REQUESTS = 12  # requests in the classroom workload
MAX_REQUESTS = 48  # the sidebar's request-count control goes up to this
MAX_TOKENS = 48  # answers are capped so one run finishes in a minute on a 2-core CPU
MIN_MODEL_LEN = 256  # the context every request may reach (what a contiguous layout reserves)
MAX_BATCHED_TOKENS = 256  # token budget of one step: bounds the slowest (prefill) step
MAX_PROMPT_CHARS = 4000  # a custom prompt longer than this is refused before tokenizing
HISTORY_LIMIT = 400  # reports kept per run
MAX_RUNS = 4  # engines one browser session keeps (each holds ~150 MB of fused weights + KV)
# the token inspector's alternatives per generated token (the engine's logprobs). Asked for
# only when not speculating: a request that asks for logprobs is never drafted, and the
# verifier's records carry the target's alternatives themselves.
ALTERNATIVES = 3


@dataclass(frozen=True)
class Settings:
    """The sidebar: switches, sizes and workload. Hashable: a run is keyed by its Settings."""

    batching: str = "continuous"  # "static" | "continuous"
    kv_layout: str = "paged"  # "contiguous" | "paged"
    spec: str = "off"  # "off" | "ngram" | "draft" | "eagle" (the trained head, if built)
    k: int = 4  # drafted tokens per step (at most, with adaptive_k)
    adaptive_k: bool = False  # choose k each step from measured costs (engine/spec/adaptive.py)
    lookup_first: bool = False  # draft / eagle: prompt lookup first, the model where it misses
    # eagle: draft only tokens the head gives at least this probability (0: always k)
    min_confidence: float = SpecConfig().min_confidence
    seats: int = 8  # max_num_seqs
    num_blocks: int = 64  # KV budget in blocks
    block_size: int = 16
    prefix_caching: bool = True  # share full prompt blocks (paged only)
    workload: str = "longtail"
    num_requests: int = NUM_REQUESTS  # requests of the workload, all arriving at step 0
    temperature: float = 0.0
    samples: int = 1  # n: answers sampled per prompt, sharing its KV blocks when paged
    model: str = MODELS[0]

    def with_(self, **changes) -> Settings:
        return replace(self, **changes)

    def engine_config(self, max_model_len: int) -> EngineConfig:
        spec = None
        if self.spec != "off":
            spec = SpecConfig(method=self.spec, num_speculative_tokens=self.k,
                              adaptive_k=self.adaptive_k,
                              prompt_lookup_first=self.lookup_first and self.spec != "ngram",
                              min_confidence=self.min_confidence if self.spec == "eagle" else 0.0)
        return EngineConfig(
            model=self.model, batching=self.batching, kv_layout=self.kv_layout, spec=spec,
            max_num_seqs=self.seats, block_size=self.block_size, num_kv_blocks=self.num_blocks,
            max_model_len=max_model_len, max_num_batched_tokens=MAX_BATCHED_TOKENS,
            enable_prefix_caching=self.prefix_caching and self.kv_layout == "paged",
            # the class steps one step at a time and waits on the page, not on kernel
            # launches: CUDA graphs would only add a capture to the first steps
            cuda_graphs=False,
        )


@dataclass(frozen=True)
class Job:
    """One request of the session's workload."""

    prompt: str
    max_tokens: int
    name: str
    ignore_eos: bool = True
    custom: bool = False  # typed in by the teacher


def preset_jobs(name: str, n: int = NUM_REQUESTS, cap: int = MAX_TOKENS) -> list[Job]:
    """A named workload (benchmarks/workloads.py), n requests, answers capped at `cap` tokens."""
    if name not in WORKLOAD_NAMES:
        raise ValueError(f"unknown workload {name!r}; choose one of {list(WORKLOAD_NAMES)}")
    # An answer that ends at EOS keeps its own max_tokens: that cap is the reservation the
    # contiguous layout makes, and the answer's own end bounds the run.
    return [Job(it.prompt, min(cap, it.max_tokens) if it.ignore_eos else it.max_tokens,
                it.name or f"{name}-{i:02d}", it.ignore_eos)
            for i, it in enumerate(get_workload(name, n))]


def model_len_for(jobs: list[Job], tokenize, block: int = 64) -> int:
    """max_model_len: at least MIN_MODEL_LEN, and room for the longest job, rounded up."""
    need = max((len(tokenize(j.prompt)) + j.max_tokens for j in jobs), default=0)
    return max(MIN_MODEL_LEN, -(-need // block) * block)


class Run:
    """One engine on one Settings, the workload added at the start, and its step history."""

    def __init__(self, settings: Settings, jobs: list[Job], max_model_len: int, progress=None):
        self.settings = settings
        self.engine = LLMEngine(settings.engine_config(max_model_len), progress=progress)
        self.history: list[dict] = []
        self.ticks = 0  # session ticks this run has consumed (a finished run consumes idly)
        self.names: dict[str, str] = {}  # request id -> job name
        self.prompts: dict[str, str] = {}  # request id -> prompt text
        for job in jobs:
            self.add(job)

    def add(self, job: Job) -> str:
        n = self.settings.samples
        params = SamplingParams(max_tokens=job.max_tokens, ignore_eos=job.ignore_eos,
                                temperature=self.settings.temperature, n=n,
                                logprobs=ALTERNATIVES if self.settings.spec == "off" else None)
        rid = self.engine.add_request(job.prompt, params)
        self.names[rid], self.prompts[rid] = job.name, job.prompt
        for i in range(n if n > 1 else 0):  # the engine runs sample i as "<rid>#<i>"
            self.names[f"{rid}#{i}"] = f"{job.name} #{i}"
            self.prompts[f"{rid}#{i}"] = job.prompt
        return rid

    @property
    def done(self) -> bool:
        return not self.engine.has_unfinished()

    @property
    def last(self) -> dict | None:
        return self.history[-1] if self.history else None

    @property
    def step_count(self) -> int:
        return self.engine.step_count

    def advance(self) -> dict | None:
        """Consume one tick: one engine step if anything is left to do."""
        report = None
        if not self.done:
            report = self.engine.step().to_dict()
            self.history.append(report)
            del self.history[:-HISTORY_LIMIT]
        self.ticks += 1
        return report

    def outputs(self) -> dict[str, str]:
        """Request id -> text so far, for every request this run has seen."""
        return {rid: r.text for rid, r in self.engine.requests.items()}


@dataclass
class Session:
    """A browser session's runs and clock. `settings` is what the sidebar shows."""

    settings: Settings = field(default_factory=Settings)
    custom: list[Job] = field(default_factory=list)
    runs: dict[Settings, Run] = field(default_factory=dict)
    tick: int = 0
    playing: bool = False
    stride: int = 1  # steps a tick of Play advances (a class-plan stop's, app/classplan.py)
    last_play_s: float = 0.0  # when Play last advanced the clock
    progress: object = None  # callback(fraction, message) used while an engine is built

    # --- the workload ------------------------------------------------------------------------
    def jobs(self, settings: Settings | None = None) -> list[Job]:
        settings = settings or self.settings
        return preset_jobs(settings.workload, settings.num_requests) + list(self.custom)

    def max_model_len(self, settings: Settings) -> int:
        from engine.model.hardware import resolve_dtype
        from engine.model.loader import load_model

        # the weights the engine will use (same dtype, same cache entry), for their tokenizer
        tok = load_model(settings.model, resolve_dtype("auto")).tokenizer
        return model_len_for(preset_jobs(settings.workload, settings.num_requests),
                             lambda p: tok.encode(p, add_special_tokens=False))

    # --- runs --------------------------------------------------------------------------------
    def run(self, settings: Settings | None = None) -> Run:
        """The run for `settings` (default: the sidebar's), built if new, caught up to tick."""
        settings = settings or self.settings
        run = self.runs.pop(settings, None)
        if run is None:
            run = Run(settings, self.jobs(settings), self.max_model_len(settings), self.progress)
        self.runs[settings] = run  # most recently used last
        self._evict()
        self.catch_up(run)
        return run

    def _evict(self) -> None:
        """Drop the least recently drawn runs beyond MAX_RUNS (never the sidebar's own)."""
        for key in list(self.runs):
            if len(self.runs) <= MAX_RUNS:
                break
            if key != self.settings:
                del self.runs[key]

    @property
    def primary(self) -> Run:
        return self.run(self.settings)

    def catch_up(self, run: Run) -> None:
        while run.ticks < self.tick:
            run.advance()

    def apply(self, settings: Settings) -> bool:
        """Take the sidebar's settings; a change drops every run (the replay starts over)."""
        if settings == self.settings:
            return False
        self.settings = settings
        self.reset()
        return True

    def reset(self) -> None:
        self.runs.clear()
        self.tick = 0
        self.playing = False
        self.stride = 1

    def step(self) -> None:
        """Advance the clock by one; every run catches up when it is next drawn."""
        self.tick += 1

    # --- the teacher's own prompt ------------------------------------------------------------
    def add_prompt(self, text: str, max_tokens: int = 32) -> str:
        """Add a prompt to every run now and to every replay later; ValueError if it is bad.

        The text is checked by the engine as typed (empty prompts are refused), then wrapped
        in the model's chat markup so the small instruct model answers it.
        """
        if len(text) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt is {len(text)} characters; at most {MAX_PROMPT_CHARS}")
        primary = self.primary
        primary.engine.tokenize(text)  # raises "prompt is empty" for blank text
        job = Job(chat(text), max_tokens, f"custom-{len(self.custom) + 1:02d}", custom=True)
        rid = primary.add(job)  # raises if it does not fit max_model_len
        for run in self.runs.values():
            if run is not primary:
                self.catch_up(run)
                run.add(job)
        self.custom.append(job)
        return rid
