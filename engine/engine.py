"""LLMEngine: add requests, step one iteration at a time, read what happened.

One step = the scheduler picks who rides and how many tokens each computes; the allocator
gives them KV slots (or the scheduler preempts); the runner runs the model once over the flat
batch; the sampler (or the speculative verifier) turns logits into tokens; requests advance,
finish or roll back rejected draft slots; a StepReport describes all of it.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig, SamplingParams
from engine.kv import ContiguousAllocator, KVPool, PagedAllocator
from engine.metrics import RunMetrics, tpot, ttft
from engine.model import cpu_ops
from engine.model.attention import get_backend
from engine.model.llama import shared_model
from engine.model.loader import Progress, load_model
from engine.report import Emitted, KVSummary, Seat, SpecRecord, StepReport
from engine.request import Request, RequestStatus
from engine.runner import ModelRunner
from engine.sampler import sample
from engine.scheduler import Scheduler


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    ttft_s: float | None
    tpot_s: float | None
    num_preemptions: int
    num_cached_tokens: int


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available")
    return torch.device(name)


@functools.lru_cache(maxsize=1)
def cpu_prefers_bf16() -> bool:
    """Does this CPU have bf16 matrix units (AMX or AVX512-BF16)?

    Measured on the 2-core Sapphire Rapids dev machine (README, performance): bf16 decodes
    several times faster than fp32 there at 16+ rows. CPUs without these units emulate
    bf16 and are slower than fp32. A timing probe at start-up was tried first; on a shared
    machine it flipped between runs, so the choice now rests on the CPU's flags."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        return torch.bfloat16 if cpu_prefers_bf16() else torch.float32
    return getattr(torch, name)


def resolve_backend(name: str, device: torch.device, cpu_kernels: bool) -> str:
    """'auto': Triton on CUDA; on a CPU the C++ kernels' backend if they loaded, else torch."""
    if name == "auto":
        if device.type == "cuda":
            return "triton"
        return "cpu" if cpu_kernels else "torch"
    if name == "cpu" and not cpu_kernels:
        raise ValueError("attention_backend='cpu' needs the C++ CPU kernels (cpu_kernels=True "
                         "on a CPU with g++); use 'torch'")
    return name


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, progress: Progress | None = None):
        self.config = cfg = config or EngineConfig()
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        loaded = load_model(cfg.model, self.dtype, progress)
        self.tokenizer = loaded.tokenizer
        mcfg = self.model_config = loaded.config
        self.eos_ids = set(mcfg.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        k = cfg.spec.num_speculative_tokens if cfg.spec else 0
        # C++ kernels for the small per-layer ops: built on first use, else the PyTorch ops
        self.cpu_ops = cfg.cpu_kernels and cpu_ops.supports(self.device, self.dtype)
        self.backend_name = resolve_backend(cfg.attention_backend, self.device, self.cpu_ops)
        # shared by every engine in this process with the same weights, dtype, packing, kernels
        self.model = shared_model(loaded, self.device, self.dtype, cfg.max_model_len + k + 1,
                                  cfg.pack_weights, self.cpu_ops)
        self.backend = get_backend(self.backend_name)
        if self.backend_name == "triton":  # ValueError on CUDA under TRITON_INTERPRET
            self.backend.check_device(self.device)

        num_blocks = self._num_blocks(cfg)
        if num_blocks < cfg.blocks_per_seq:
            raise ValueError(
                f"num_kv_blocks={num_blocks} is too small: one request of max_model_len="
                f"{cfg.max_model_len} needs {cfg.blocks_per_seq} blocks of block_size="
                f"{cfg.block_size}")
        self.pool = KVPool(mcfg.num_layers, num_blocks, cfg.block_size, mcfg.num_kv_heads,
                           mcfg.head_dim, self.dtype, self.device)
        if cfg.kv_layout == "paged":
            self.allocator = PagedAllocator(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        else:
            self.allocator = ContiguousAllocator(num_blocks, cfg.block_size, cfg.max_model_len)
        self.scheduler = Scheduler(cfg, self.allocator)
        self.runner = ModelRunner(self.model, self.pool, self.allocator, self.backend, self.device)
        self.spec = None
        if cfg.spec is not None:
            from engine.spec.decoder import SpecDecoder

            self.spec = SpecDecoder(self, cfg.spec)
        self.requests: dict[str, Request] = {}
        self.metrics = RunMetrics()
        self.step_count = 0
        self._ids = itertools.count()
        self._to_abort: list[str] = []  # abort_request() ids, taken out at the next step

    def _num_blocks(self, cfg: EngineConfig) -> int:
        if cfg.num_kv_blocks is not None or self.device.type != "cuda":
            return cfg.resolved_num_kv_blocks
        # CUDA: size the pool from free memory
        free, _ = torch.cuda.mem_get_info(self.device)
        m = self.model_config
        per_block = KVPool.bytes_per_block(m.num_layers, cfg.block_size, m.num_kv_heads,
                                           m.head_dim, self.dtype)
        return max(cfg.resolved_num_kv_blocks, int(free * cfg.gpu_memory_utilization) // per_block)

    # --- requests ---------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError("prompt must be non-empty text or a non-empty list of token ids")
        vocab = self.model_config.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        return list(prompt)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        ids = self.tokenize(prompt)
        if len(ids) >= self.config.max_model_len:
            raise ValueError(
                f"prompt is {len(ids)} tokens; max_model_len={self.config.max_model_len} "
                f"leaves room for at most {self.config.max_model_len - 1}")
        rid = request_id or f"r{next(self._ids)}"
        if rid in self.requests:
            raise ValueError(f"request_id {rid!r} is already in use")
        seed = params.seed if params.seed is not None else self.config.seed * 100003 + len(
            self.requests)
        gen = torch.Generator().manual_seed(seed)
        req = Request(rid, ids, params, generator=gen)
        if arrival_time is not None:
            req.arrival_time = arrival_time
        self.requests[rid] = req
        self.scheduler.add(req)
        return rid

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        """Apply the model's chat template, then generate (as vLLM's LLM.chat)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return self.generate([list(ids)], params)[0]

    def abort_request(self, request_id: str) -> bool:
        """Stop a request (vLLM's name): its client went away. At the start of the next step
        it leaves its seat or the queue and its blocks are freed; that step's report lists it
        under `aborted`. False if there is no such unfinished request."""
        req = self.requests.get(request_id)
        if req is None or req.is_finished or request_id in self._to_abort:
            return False
        self._to_abort.append(request_id)
        return True

    def _take_out_aborted(self) -> list[str]:
        aborted, self._to_abort = self._to_abort, []
        for rid in aborted:
            req = self.requests[rid]
            req.status = RequestStatus.FINISHED
            req.finish_reason = "abort"
            req.finish_time = time.perf_counter()
            self.scheduler.abort(req)
            if self.spec is not None:
                self.spec.release(req)
        return aborted

    def has_unfinished(self) -> bool:
        return bool(self._to_abort) or self.scheduler.has_unfinished()

    def output(self, rid: str) -> RequestOutput:
        r = self.requests[rid]
        return RequestOutput(rid, r.prompt_token_ids, list(r.output_token_ids), r.text,
                             r.finish_reason, ttft(r), tpot(r), r.num_preemptions,
                             r.num_cached_tokens)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Run the prompts to completion; outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        plist = params if isinstance(params, list) else [params] * len(prompts)
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while any(not self.requests[r].is_finished for r in rids):
            self.step()
        return [self.output(r) for r in rids]

    # --- one step ---------------------------------------------------------------------------
    def step(self) -> StepReport:
        t0 = time.perf_counter()
        aborted = self._take_out_aborted()
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)
        sched = self.scheduler.schedule()
        emitted: list[Emitted] = []
        finished: list[str] = []
        spec_records: list[SpecRecord] = []
        live = [s for s in sched.scheduled if not s.idle]
        if sched.scheduled:
            fwd = self.runner.run(sched.scheduled)
            now = time.perf_counter()
            for s in live:
                req = s.req
                req.num_computed_tokens += s.num_tokens
                if req.request_id not in fwd.rows:
                    self.allocator.on_computed(req)
                    continue
                first, n = fwd.rows[req.request_id]
                logits = fwd.logits[first:first + n]
                if req.spec_token_ids:
                    new_tokens, record = self.spec.verify(req, logits)
                    spec_records.append(record)
                    # keep the KV of the last real token and the accepted drafts only
                    req.num_computed_tokens = req.num_tokens + len(new_tokens) - 1
                    req.spec_token_ids = []
                    self.allocator.truncate(req, req.num_computed_tokens)
                else:
                    new_tokens = [sample(logits[-1], req.sampling, req.generator)]
                self.allocator.on_computed(req)
                kept = self._append(req, new_tokens, now)
                emitted.append(Emitted(req.request_id, kept, self._detokenize(req)))
                if req.finish_reason is not None:
                    self._finish(req, now)
                    finished.append(req.request_id)
        t1 = time.perf_counter()
        self.step_count += 1
        report = self._report(t1 - t0, sched, emitted, finished, spec_records)
        self.metrics.on_step(t1, t1 - t0, sum(len(e.token_ids) for e in emitted),
                             busy=sum(1 for r in self.scheduler.running if not r.idle_finished),
                             idle=sum(1 for r in self.scheduler.running if r.idle_finished),
                             useful_slots=report.kv.used_slots,
                             held_slots=report.kv.allocated_slots)
        report.metrics = self.metrics_snapshot()
        report.aborted = aborted
        return report

    def _append(self, req: Request, tokens: list[int], now: float) -> list[int]:
        """Append tokens one at a time, stopping at the first stop condition."""
        kept = []
        sp = req.sampling
        for tok in tokens:
            req.output_token_ids.append(tok)
            req.token_times.append(now)
            kept.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
            if tok in self.eos_ids and not sp.ignore_eos:
                req.finish_reason = "eos"
            elif req.num_output_tokens >= sp.max_tokens:
                req.finish_reason = "length"
            elif req.num_tokens >= self.config.max_model_len:
                req.finish_reason = "max_model_len"
            elif sp.stop:
                tail = self.tokenizer.decode(req.output_token_ids[-32:], skip_special_tokens=False)
                if any(s in tail for s in sp.stop):
                    req.finish_reason = "stop"
            if req.finish_reason is not None:
                break
        if req.finish_reason is not None and req.num_computed_tokens > req.num_tokens - 1:
            req.num_computed_tokens = req.num_tokens - 1
            self.allocator.truncate(req, req.num_computed_tokens)
        return kept

    def _visible_text(self, req: Request) -> str:
        """The output text a client may see now. As in vLLM, a stop string ends the text and
        is not part of it (token_ids keep every generated token); while the request runs, a
        tail that could be the start of a stop string is held back, so nothing streamed is
        ever taken back."""
        full = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=False)
        stops = req.sampling.stop or []
        if req.finish_reason == "stop":
            return full[:min(full.find(s) for s in stops if s in full)]
        if req.finish_reason is None:
            hold = max((k for s in stops for k in range(1, len(s)) if full.endswith(s[:k])),
                       default=0)
            return full[:len(full) - hold]
        return full

    def _detokenize(self, req: Request) -> str:
        """New text since last time; held back while a multi-byte character is incomplete."""
        full = self._visible_text(req)
        if full.endswith("\ufffd") and req.finish_reason is None:
            return ""
        delta = full[len(req.text):] if full.startswith(req.text) else full
        req.text = full
        return delta

    def _finish(self, req: Request, now: float) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_time = now
        req.text = self._visible_text(req)
        self.scheduler.finish(req)
        self.metrics.on_finish(req)
        if self.spec is not None:
            self.spec.release(req)  # free its draft state (preempted ones: at the next propose)

    # --- reports ----------------------------------------------------------------------------
    def kv_summary(self) -> KVSummary:
        alloc, bs = self.allocator, self.config.block_size
        running = self.scheduler.running
        views = alloc.block_map(running)
        used = sum(v.tokens for v in views)
        held = sum(bs for v in views if v.owners)
        free_blocks = alloc.num_free_blocks
        largest = alloc.largest_free_run()
        return KVSummary(
            block_size=bs, num_blocks=alloc.num_blocks, layout=alloc.layout,
            blocks=[vars(v) for v in views],
            block_tables={r.request_id: list(r.block_table) for r in running},
            used_slots=used, allocated_slots=held, internal_waste_slots=held - used,
            free_slots=free_blocks * bs, total_slots=alloc.num_blocks * bs,
            free_blocks=free_blocks, largest_free_run=largest,
            useful_frac=used / held if held else 1.0,
            external_frag=1 - largest / free_blocks if free_blocks else 0.0,
            prefix_hit_rate=getattr(alloc, "prefix_hit_rate", None),
        )

    def _report(self, wall, sched, emitted, finished, spec_records) -> StepReport:
        computed = {s.req.request_id: s.num_tokens for s in sched.scheduled}
        seats = []
        for i, r in enumerate(self.scheduler.seats):
            if r is None:
                seats.append(Seat(i, None, "empty"))
                continue
            state = ("idle-finished" if r.idle_finished else
                     "prefill" if r.in_prefill else "running")
            seats.append(Seat(i, r.request_id, state, r.num_tokens, r.num_output_tokens,
                              computed.get(r.request_id, 0)))
        return StepReport(
            step=self.step_count, wall_s=wall, switches=self.config.switches(),
            num_batched_tokens=sched.num_tokens, seats=seats,
            waiting=[r.request_id for r in self.scheduler.waiting],
            admitted=sched.admitted, finished=finished, preempted=sched.preempted,
            blocked_reason=sched.blocked_reason, emitted=emitted, kv=self.kv_summary(),
            spec=spec_records,
        )

    def metrics_snapshot(self) -> dict:
        snap = self.metrics.snapshot()
        running = self.scheduler.running
        snap["seats_busy"] = sum(1 for r in running if not r.idle_finished)
        snap["seats_total"] = self.config.max_num_seqs
        kv = self.allocator
        snap["kv_used_frac"] = 1 - kv.num_free_blocks / kv.num_blocks
        snap["prefix_hit_rate"] = getattr(kv, "prefix_hit_rate", None)
        snap["waiting"] = len(self.scheduler.waiting)
        return snap

    def describe(self) -> str:
        return (f"{self.config.model} on {self.device.type} ({str(self.dtype).removeprefix('torch.')}"
                f", attention: {self.backend_name}"
                f"{', C++ layer ops' if self.cpu_ops else ''})")
