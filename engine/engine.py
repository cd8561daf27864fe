"""LLMEngine: add requests, step one iteration at a time, read what happened.

One step = the scheduler picks who rides and how many tokens each computes; the allocator
gives them KV slots (or the scheduler preempts); the runner runs the model once over the flat
batch; the sampler (or the speculative verifier) turns logits into tokens; requests advance,
finish or roll back rejected draft slots; a StepReport describes all of it.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch

from engine.config import EngineConfig, SamplingParams
from engine.inputs import InputProcessor
from engine.metrics import RunMetrics
from engine.model.attention import get_backend
from engine.model.llama import shared_model
from engine.model.loader import Progress, hf_folder, load_model, read_config
from engine.outputs import RequestOutput, emit
from engine.plan import ExecutionPlan, ModelFacts, plan_for
from engine.report import KVSummary, StepReport, build_report, kv_summary
from engine.request import Request
from engine.runner import ForwardResult, ModelRunner, Pending, kv_cache
from engine.sampler import Sampler, greedy_ids, logit_rows
from engine.scheduler import Scheduler, SchedulerOutput
from engine.threads import freeze_startup_heap

__all__ = ["LLMEngine", "RequestOutput", "freeze_startup_heap"]  # the last two: moved


class LLMEngine:
    # the plan's choices (self.plan, engine/plan.py), read from it, never copied: the names
    # other code reads. uses_graphs: decode steps replay CUDA graphs (engine/graphs.py)
    device = property(lambda self: torch.device(self.plan.device))
    dtype = property(lambda self: self.plan.torch_dtype)
    kv_dtype = property(lambda self: self.plan.torch_kv_dtype)  # the KV pool's numbers
    backend_name = property(lambda self: self.plan.attention)
    uses_cpu_kernels = property(lambda self: self.plan.cpu_kernels)
    uses_graphs = property(lambda self: self.plan.cuda_graphs)

    def __init__(self, config: EngineConfig | None = None, progress: Progress | None = None):
        self.config = cfg = config or EngineConfig()
        # how every step runs, decided once (engine/plan.py) from the config, this machine and
        # the model's config (read before its weights, whose dtype the plan decides)
        facts = ModelFacts.of(cfg.model, read_config(hf_folder(cfg.model, progress)))
        self.plan: ExecutionPlan = plan_for(cfg, facts)
        plan = self.plan
        loaded = load_model(cfg.model, self.dtype, progress)
        self.tokenizer = loaded.tokenizer
        mcfg = self.model_config = loaded.config
        self.eos_ids = set(mcfg.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        k = cfg.spec.num_speculative_tokens if cfg.spec else 0
        # built as the plan says; shared by every engine in this process whose plan builds the same
        self.model = shared_model(loaded, plan, cfg.max_model_len + k + 1)
        self.backend = get_backend(self.backend_name)
        if self.backend_name == "triton":  # ValueError on CUDA under TRITON_INTERPRET
            self.backend.check_device(self.device)

        # pool: as many KV blocks as the seats need (engine/runner.py), and their allocator
        self.pool, self.allocator = kv_cache(cfg, mcfg, self.kv_dtype, self.device,
                                             spare_block=self.uses_graphs)
        self.scheduler = Scheduler(cfg, self.allocator, self.eos_ids)
        self.inputs = InputProcessor(cfg, self.tokenizer, mcfg.vocab_size)  # add_request's checks
        # the runner, its kernels compiled and its decode graphs captured (on a GPU)
        self.runner = ModelRunner.started(cfg, mcfg, self.model, self.pool, self.allocator,
                                          self.backend, self.device, k,
                                          triton=self.backend_name == "triton",
                                          graphs=self.uses_graphs)
        self.spec_decoder = None  # drafts before a step, verifies after (engine/spec/)
        if cfg.spec is not None:
            from engine.spec.decoder import SpecDecoder

            self.spec_decoder = SpecDecoder(self, cfg.spec)
            self.runner.keep_hidden = self.spec_decoder.wants_features  # EAGLE reads them
        # logits -> tokens (engine/sampler.py); drafts go to the verifier
        self.sampler = Sampler(self.eos_ids, self.spec_decoder and self.spec_decoder.verify)
        # a callable given every forward's hidden states (runner.keep_hidden must be on):
        # train_draft records the target's features while it generates its training answers
        self.feature_observer = None
        self.requests: dict[str, Request] = {}
        self.groups: dict[str, list[str]] = {}  # n > 1: the client's id -> its samples' ids
        self._aborted: list[str] = []  # aborted since the last step, for its report
        # requests that failed alone (their sampling or detokenizing raised): id -> what
        # failed, until forgotten. They leave like aborted ones (listed under `aborted`,
        # blocks freed) and their step's report lists them under `failures`: a server tells
        # each its own error and the others go on.
        self.failures: dict[str, str] = {}
        self._logprobs: dict[str, list] = {}  # this step's output logprobs, by request id
        # async scheduling: the step whose forward ran and whose tokens are not appended yet
        self._inflight: _InFlight | None = None
        self.overlapped_steps = 0  # steps launched while the one before was still in flight
        self.metrics = RunMetrics()
        self.step_count = 0
        self._ids = itertools.count()

    @property
    def on_forward(self):
        """A callable run once a step's forward has its inputs laid out, just before the
        model runs (None: nothing). A server hands out the previous step's tokens there
        (engine/server/loop.py), so that its HTTP thread works while the forward holds no
        GIL; the runner calls it (`ModelRunner.on_forward`)."""
        return self.runner.on_forward

    @on_forward.setter
    def on_forward(self, fn) -> None:
        self.runner.on_forward = fn

    @property
    def kernel_warmup_s(self) -> float:
        """Startup time spent compiling kernels (`ModelRunner.warm_up`)."""
        return self.runner.kernel_warmup_s

    @property
    def graph_capture_s(self) -> float:
        """Startup time spent capturing CUDA graphs (`ModelRunner.capture`)."""
        return self.runner.graph_capture_s

    # --- requests ---------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        return self.inputs.tokenize(prompt)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a prompt, checked by `engine/inputs.py`. With params.n > 1 the n samples are
        requests `<id>#<i>` (see `sample_ids`; with paged KV forked from sample 0 once it
        computed the prompt: `InputProcessor.requests`)."""
        ids, params = self.inputs.process(prompt, params)
        rid = request_id or f"r{next(self._ids)}"
        reqs = self.inputs.requests(rid, ids, params, arrival_time, len(self.requests))
        for taken in [rid, *(r.request_id for r in reqs)]:
            if taken in self.requests or taken in self.groups:
                raise ValueError(f"request_id {taken!r} is already in use")
        self.requests.update((r.request_id, r) for r in reqs)
        if params.n > 1:
            self.groups[rid] = [r.request_id for r in reqs]
        for r in reqs[:1] if reqs[0].fork_children else reqs:  # forked ones board with it
            self.scheduler.add(r)
        return rid

    def sample_ids(self, rid: str) -> list[str]:
        """The engine's request ids of a client's request: itself, or its n samples."""
        return self.groups.get(rid, [rid])

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        """Apply the model's chat template, then generate (as vLLM's LLM.chat)."""
        return self.generate([self.inputs.chat(messages)], params)[0]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    def output(self, rid: str) -> RequestOutput:
        if rid in self.groups:
            return RequestOutput.of_group(rid, [self.requests[s] for s in self.groups[rid]])
        return RequestOutput.of(self.requests[rid])

    def is_finished(self, rid: str) -> bool:
        return all(self.requests[s].is_finished for s in self.sample_ids(rid))

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Run the prompts to completion; outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        plist = params if isinstance(params, list) else [params] * len(prompts)
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while not all(self.is_finished(r) for r in rids):
            self.step()
        return [self.output(r) for r in rids]

    def abort_request(self, rid: str) -> None:
        """Stop a request now (vLLM's name): a client that went away. Its seat and blocks are
        free for the next step, and that step's report lists it under `aborted`. A request
        with n samples: all of them."""
        if rid in self.groups:
            for sid in self.groups[rid]:
                self.abort_request(sid)
            return
        req = self.requests.get(rid)
        if req is None:
            raise ValueError(f"no request {rid!r}")
        if req.is_finished:
            return
        pending, req.fork_children = req.fork_children, []
        self.scheduler.abort(req)
        req.finish_time = time.perf_counter()
        self._aborted.append(rid)
        if self.spec_decoder is not None:
            self.spec_decoder.release(req)
        for child in pending:  # samples never forked: they end with it
            self.scheduler.abort(child)
            child.finish_time = req.finish_time
            self._aborted.append(child.request_id)

    def forget(self, rid: str) -> None:
        """Drop a finished (or aborted) request's record; a server calls this once the client
        has its answer, so memory stays flat however many requests it serves."""
        for sid in self.sample_ids(rid):
            req = self.requests.get(sid)
            if req is not None and not req.is_finished:
                raise ValueError(f"request {sid!r} is still running; abort it first")
        for sid in self.sample_ids(rid):
            self.requests.pop(sid, None)
            self.failures.pop(sid, None)
        self.groups.pop(rid, None)

    # --- one step ---------------------------------------------------------------------------
    def step(self) -> StepReport:
        """One iteration: draft (if speculating), schedule, run the model once, sample or
        verify, advance every request (Scheduler.update_from_output), describe the step."""
        if self.config.async_scheduling and (self._inflight is not None or self._can_overlap()):
            return self._step_overlapped()
        t0 = time.perf_counter()
        if self.spec_decoder is not None:
            self.spec_decoder.propose(self.scheduler.running)
        t_drafted = time.perf_counter()
        sched = self.scheduler.schedule()
        sampled, spec_records, copied = {}, [], []
        if sched.scheduled:
            fwd = self.runner.run(sched.scheduled)
            copied = self.runner.copied
            if fwd.hidden is not None and self.spec_decoder is not None:
                self.spec_decoder.observe(fwd)
            if fwd.hidden is not None and self.feature_observer is not None:
                self.feature_observer(fwd)
            sampled, spec_records = self._sample_isolated(fwd)
        return self._advance(sched, sampled, spec_records, copied, t0, t_drafted)

    def _step_overlapped(self) -> StepReport:
        """Async scheduling (EngineConfig.async_scheduling): launch step n + 1, then read step
        n's tokens and advance its requests; the report is step n's. On a GPU the host waits
        for step n's tokens while the device already runs step n + 1; step n + 1's decode
        inputs are step n's tokens as they lie on the device (runner.Pending). A request's
        token that ends it is computed on once more and thrown away (vLLM does the same).
        Only plain requests are launched this way (`_can_overlap`); once another is in the
        engine the step in flight lands and the next steps run as without async scheduling."""
        if self._inflight is None:
            self._inflight = self._launch(None)
        prev = self._inflight
        self._inflight = None
        if prev.sched.scheduled and self._can_overlap():
            self._inflight = self._launch(prev)
            self.overlapped_steps += bool(self._inflight.sched.scheduled)
        return self._land(prev)

    def _can_overlap(self) -> bool:
        """No request needs its last token on the host before its next sampling: penalties,
        logit_bias and min_tokens read the output so far, logprobs and n > 1 are handed over
        with the tokens (they run without overlap, as in vLLM's first async scheduling)."""
        def plain(r: Request) -> bool:
            return r.sampling.speculable and r.sampling.prompt_logprobs is None

        return all(map(plain, self.scheduler.running)) and all(map(plain, self.scheduler.waiting))

    def _launch(self, prev: _InFlight | None) -> _InFlight:
        """Schedule a step and start its forward and sampling; nothing is read back here.
        `prev`: the step still in flight, whose tokens this one's decode inputs are."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        fl = _InFlight(sched, t0)
        if not sched.scheduled:
            return fl
        pending = Pending(prev.tokens, prev.rows) if prev is not None and prev.rows else None
        fwd = self.runner.run(sched.scheduled, pending)
        fl.copied = self.runner.copied
        self.scheduler.launched(sched, fwd.rows)
        fl.rows = {rid: i for i, rid in enumerate(fwd.rows)}
        if not fl.rows:
            return fl
        if all(self.requests[rid].sampling.greedy for rid in fwd.rows):
            # argmax where the logits are: nothing waits for the device
            fl.tokens = greedy_ids(logit_rows(
                fwd.logits, [first + n - 1 for first, n in fwd.rows.values()]))
        else:  # a sampled row's generator lives on the host: its tokens come back now
            fl.sampled, _ = self._sample_isolated(fwd)
            fl.tokens = torch.tensor([fl.sampled.get(rid, [0])[-1] for rid in fwd.rows],
                                     device=self.device)
        return fl

    def _land(self, fl: _InFlight) -> StepReport:
        """Read a launched step's tokens (the only wait for the device) and advance."""
        sampled = fl.sampled
        if sampled is None:
            ids = fl.tokens.tolist() if fl.tokens is not None else []
            sampled = {rid: [ids[i]] for rid, i in fl.rows.items()}
        return self._advance(fl.sched, sampled, [], fl.copied, fl.t0, fl.t0, launched=True)

    def _advance(self, sched: SchedulerOutput, sampled: dict[str, list[int]],
                 spec_records: list, copied: list, t0: float, t_drafted: float,
                 launched: bool = False) -> StepReport:
        """A step's tokens -> its requests advanced, finished, detokenized; its report."""
        now = time.perf_counter()
        advanced = self.scheduler.update_from_output(sched, sampled, now, launched)
        self._fail_requests(self.scheduler.failed)
        self.scheduler.failed = []
        logprobs, self._logprobs = self._logprobs, {}
        emitted, finished = emit(advanced, logprobs)
        for req in finished:
            self.metrics.on_finish(req)
            if self.spec_decoder is not None:
                self.spec_decoder.release(req)  # preempted ones: at the next propose
        t1 = time.perf_counter()
        self.step_count += 1
        aborted, self._aborted = self._aborted, []
        plan = None
        if self.spec_decoder is not None:
            self.spec_decoder.on_step(sched, t1 - t_drafted)  # adaptive k learns the cost
            plan = self.spec_decoder.plan()
        failures = {rid: self.failures[rid] for rid in aborted if rid in self.failures}
        report = build_report(self.step_count, t1 - t0, self.config, self.scheduler, sched,
                              emitted, [r.request_id for r in finished], aborted,
                              spec_records, plan, copied, failures)
        self.metrics.on_step(t1, t1 - t0, sum(len(e.token_ids) for e in emitted),
                             busy=report.num_running,
                             idle=len(self.scheduler.running) - report.num_running,
                             useful_slots=report.kv.used_slots,
                             held_slots=report.kv.allocated_slots)
        report.metrics = self.metrics_snapshot()
        return report

    def _sample_isolated(self, fwd: ForwardResult):
        """The sampler's tokens (`Sampler.sample`), with one request's failure kept to that
        request. The batch is sampled at once; only if that raises are the requests sampled
        one by one (their generators first set back, so each draws what it would have drawn),
        and those that still fail leave the step (`_fail_requests`) while the others keep
        their tokens. Output logprobs wait in `_logprobs` for `_advance`."""
        gens = {rid: self.requests[rid].generator for rid in fwd.rows}
        states = {rid: g.get_state() for rid, g in gens.items()
                  if g is not None and not self.requests[rid].sampling.greedy}
        # prompt log-probabilities are appended as the batch is read: a retry starts from these
        kept_lps = {rid: len(self.requests[rid].prompt_logprobs or ()) for rid in fwd.prompt_rows}
        try:
            sampled, records, logprobs = self.sampler.sample(fwd, self.requests)
        except Exception:
            pass
        else:
            self._logprobs.update(logprobs)
            return sampled, records
        sampled, records, failed = {}, [], []
        for rid in kept_lps:
            if self.requests[rid].prompt_logprobs is not None:
                del self.requests[rid].prompt_logprobs[kept_lps[rid]:]
        alone = {rid: None for rid in [*fwd.rows, *fwd.prompt_rows]}  # in order, once each
        for rid in alone:
            if rid in states:
                gens[rid].set_state(states[rid])
            rows = {rid: fwd.rows[rid]} if rid in fwd.rows else {}
            own = {rid: fwd.prompt_rows[rid]} if rid in fwd.prompt_rows else {}
            try:
                got = self.sampler.sample(dataclasses.replace(fwd, rows=rows, prompt_rows=own),
                                          self.requests)
            except Exception as exc:
                failed.append((self.requests[rid], exc))
                continue
            sampled.update(got.sampled)
            records.extend(got.records)
            self._logprobs.update(got.logprobs)
        self._fail_requests(failed)
        return sampled, records

    def _fail_requests(self, failed: list) -> None:
        """Each (request, exception) leaves the engine now, as an abort does (seat and blocks
        freed, listed under the step's `aborted`), with what failed kept in `failures`."""
        for req, exc in failed:
            self.failures[req.request_id] = f"{type(exc).__name__}: {exc}"[:500]
            self.abort_request(req.request_id)

    def kv_summary(self) -> KVSummary:
        return kv_summary(self.allocator, self.scheduler.running)

    def metrics_snapshot(self) -> dict:
        """The run's figures (engine/metrics.py) and the seats, KV and queue now."""
        return self.metrics.snapshot(self.scheduler, self.config.max_num_seqs)

    def describe(self) -> str:
        """The model and the plan in one line (the app's sidebar, engine.serve, the benches)."""
        return f"{self.config.model} on {self.plan.describe()}"


@dataclasses.dataclass
class _InFlight:
    """A step launched by async scheduling whose tokens are not read back yet."""

    sched: SchedulerOutput
    t0: float
    copied: list = dataclasses.field(default_factory=list)
    rows: dict[str, int] = dataclasses.field(default_factory=dict)  # sampling request -> row
    tokens: torch.Tensor | None = None  # [rows] int64 on the model's device
    sampled: dict[str, list[int]] | None = None  # already on the host (non-greedy rows)

