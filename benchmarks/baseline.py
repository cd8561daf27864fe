"""The naive server: "ten lines of transformers" on static padded batches.

Chapter 6.4 opens with an experiment: serve a model with ten lines of Python's transformers
library, then with a real serving engine on the same model and the same hardware, and
measure. This file is the ten lines, made measurable. The heart of it is:

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for batch in chunks(requests_in_arrival_order, batch_size):
        enc = tok([r.prompt for r in batch], padding=True, padding_side="left",
                  return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=max(r.max_tokens for r in batch),
                             do_sample=False)
        for r, row in zip(batch, out[:, enc.input_ids.shape[1]:]):
            r.reply(tok.decode(row[: r.max_tokens]))

It is the tour bus of the chapter (leak one): a batch boards together and leaves together.
With one `max_new_tokens` per batch every row runs until the longest answer is done;
a request that wanted 8 tokens keeps its seat, and its row is still computed, while its
neighbour writes 200. Each request counts only its own `max_tokens` as useful output;
`idle_seat_frac` is the share of computed row-steps that were not useful. The next batch
boards only when this one has finished.

Arrivals: when the server is free it boards whoever has arrived, in arrival order, up to
`batch_size` (the engine's `max_num_seqs`); if nobody is there it waits for the next
arrival. The wait is not slept: the run keeps a clock of measured compute time plus
skipped idle gaps, so a Poisson workload costs only its compute time to run.

Timing: `generate` does not stream, so a `LogitsProcessor` that HF calls once per
decoding step stamps the moment each step's logits exist: step 0 is the prefill (time to
first token), step i the i-th decode. The client of a non-streaming server sees its answer
only when the batch returns (`latency_s`); TTFT and TPOT here are measured per token as if
the server streamed, the kindest reading for the naive server.

`reference_greedy` runs one prompt at a time, unpadded: the ground truth the engine's
greedy outputs are tested against.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
)

from benchmarks.workloads import WorkItem, Workload
from engine.model.loader import hf_folder

Progress = Callable[[float, str], None]  # (fraction done in [0, 1], message)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _resolve(device: str, dtype: torch.dtype | str) -> tuple[str, torch.dtype]:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be one of ['auto', 'cpu', 'cuda'], got {device!r}")
    if isinstance(dtype, str):
        if dtype == "auto":
            dtype = "bfloat16" if device == "cuda" else "float32"
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {['auto', *_DTYPES]}, got {dtype!r}")
        dtype = _DTYPES[dtype]
    if dtype not in _DTYPES.values():
        raise ValueError(f"dtype must be one of {['auto', *_DTYPES]}, got {dtype!r}")
    return device, dtype


def load_hf(model: str = "smollm2-135m", dtype: torch.dtype | str = torch.float32,
            device: str = "cpu"):
    """(HF model, tokenizer) for a bundled model name or a local folder, loaded once."""
    device, dtype = _resolve(device, dtype)
    return _load_hf(model, dtype, device)


@functools.lru_cache(maxsize=4)
def _load_hf(model: str, dtype: torch.dtype, device: str):
    folder = hf_folder(model)
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    return hf, tok


def _eos_ids(hf) -> set[int]:
    eos = hf.generation_config.eos_token_id
    if eos is None:
        eos = hf.config.eos_token_id
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)


class StepClock(LogitsProcessor):
    """A logits processor that changes nothing and stamps the time of every decoding step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.is_cuda:  # kernels run asynchronously: wait until the logits really exist
            torch.cuda.synchronize(scores.device)
        self.times.append(time.perf_counter())
        return scores


def _generate(hf, enc: dict, max_new_tokens: int, ignore_eos: bool, pad_id: int,
              clock: StepClock | None = None) -> torch.Tensor:
    """Greedy HF generate. With ignore_eos, EOS does not stop generation but is not
    forbidden either: `eos_token_id=None` turns off the stopping criterion, so the model
    may emit <|im_end|> and simply carries on, which is vLLM's `ignore_eos`. The other
    option, `min_new_tokens`, masks EOS out of the logits and would change the tokens."""
    kwargs = {}
    if ignore_eos:
        kwargs["eos_token_id"] = None
    if clock is not None:
        kwargs["logits_processor"] = LogitsProcessorList([clock])
    with torch.inference_mode():
        return hf.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=pad_id, **kwargs)


@dataclass
class BaselineRequest:
    """One request as the naive server handled it. Times are seconds since the run began."""

    name: str
    prompt: str
    max_tokens: int
    ignore_eos: bool
    prompt_tokens: int
    token_ids: list[int]  # its useful output: at most max_tokens, cut after EOS unless ignore_eos
    text: str
    batch_index: int
    arrival_s: float
    start_s: float  # its batch boarded
    first_token_s: float  # its first token's logits existed (the prefill step)
    last_token_s: float  # its own last useful token existed
    done_s: float  # its batch returned: when a non-streaming client gets the answer

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        n = len(self.token_ids)
        return (self.last_token_s - self.first_token_s) / (n - 1) if n > 1 else None

    @property
    def latency_s(self) -> float:
        return self.done_s - self.arrival_s


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


@dataclass
class BaselineResult:
    """What the naive server did. `summary()` has the keys the engine's bench reports."""

    model: str
    device: str
    dtype: str
    batch_size: int
    workload: str
    wall_s: float  # from the first arrival (t = 0) to the last batch's return
    row_steps: int  # rows x decoding steps actually computed, summed over batches
    steps: int  # decoding steps (one forward of the whole batch each), summed over batches
    prompt_slots: int  # rows x padded prompt length, summed over batches
    prompt_pad_slots: int  # of which left padding
    max_concurrency: int  # the most requests that sat in one batch
    requests: list[BaselineRequest] = field(default_factory=list)
    system: str = "naive"

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def output_tok_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def idle_seat_frac(self) -> float:
        """Row-steps computed for rows that had already written their own max_tokens (or
        their EOS): the finished riders who keep their seats."""
        return 1.0 - self.output_tokens / self.row_steps if self.row_steps else 0.0

    @property
    def prompt_pad_frac(self) -> float:
        return self.prompt_pad_slots / self.prompt_slots if self.prompt_slots else 0.0

    def summary(self) -> dict:
        ttft = [r.ttft_s for r in self.requests]
        tpot = [r.tpot_s for r in self.requests if r.tpot_s is not None]
        return {
            "system": self.system,
            "workload": self.workload,
            "requests": len(self.requests),
            "output_tokens": self.output_tokens,
            "wall_s": self.wall_s,
            "output_tok_per_s": self.output_tok_per_s,
            "ttft_p50_s": _pct(ttft, 50),
            "ttft_p99_s": _pct(ttft, 99),
            "tpot_p50_s": _pct(tpot, 50),
            "latency_p50_s": _pct([r.latency_s for r in self.requests], 50),
            "idle_seat_frac": self.idle_seat_frac,
            "prompt_pad_frac": self.prompt_pad_frac,
            "max_concurrency": self.max_concurrency,
            "steps": self.steps,
        }

    def to_dict(self) -> dict:
        reqs = [dict(asdict(r), ttft_s=r.ttft_s, tpot_s=r.tpot_s, latency_s=r.latency_s)
                for r in self.requests]
        return {**self.summary(), "model": self.model, "device": self.device,
                "dtype": self.dtype, "batch_size": self.batch_size, "per_request": reqs}


class NaiveServer:
    """HF transformers `generate()` on static, left-padded batches of `batch_size`."""

    def __init__(self, model: str = "smollm2-135m", dtype: torch.dtype | str = torch.float32,
                 batch_size: int = 8, device: str = "auto") -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.device, self.dtype = _resolve(device, dtype)
        self.model_name = model
        self.batch_size = batch_size
        self.model, self.tokenizer = load_hf(model, self.dtype, self.device)
        self.eos_ids = _eos_ids(self.model)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)
        if pad is None:  # batches are padded: newer transformers refuse without a pad token
            self.tokenizer.pad_token = self.tokenizer.convert_ids_to_tokens(self.pad_id)

    def run(self, workload: Workload | Sequence[WorkItem],
            progress: Progress | None = None) -> BaselineResult:
        items = list(workload.items if isinstance(workload, Workload) else workload)
        order = sorted(range(len(items)), key=lambda i: (items[i].arrival_s, i))
        done: dict[int, BaselineRequest] = {}
        now = 0.0  # the run's clock: measured compute plus skipped idle gaps
        row_steps = prompt_slots = pad_slots = max_conc = total_steps = 0
        pos = batch_index = 0
        while pos < len(order):
            now = max(now, items[order[pos]].arrival_s)  # idle until someone is at the door
            batch = []
            while (pos < len(order) and len(batch) < self.batch_size
                   and items[order[pos]].arrival_s <= now):
                batch.append(order[pos])
                pos += 1
            reqs = [items[i] for i in batch]
            max_conc = max(max_conc, len(batch))

            t0 = time.perf_counter()
            enc = self.tokenizer([r.prompt for r in reqs], padding=True, padding_side="left",
                                 return_tensors="pt").to(self.device)
            clock = StepClock()
            # One EOS rule per generate call: if any rider ignores EOS the batch runs to the
            # longest max_tokens; otherwise HF may end the batch early once every row has
            # written EOS (rows that finish early are padded, still computed).
            ignore_eos = any(r.ignore_eos for r in reqs)
            out = _generate(self.model, enc, max(r.max_tokens for r in reqs), ignore_eos,
                            self.pad_id, clock)
            t_end = time.perf_counter()

            width = enc["input_ids"].shape[1]
            real = enc["attention_mask"].sum(dim=1).tolist()
            new = out[:, width:].tolist()
            steps = len(new[0])
            assert len(clock.times) == steps, (len(clock.times), steps)
            row_steps += len(reqs) * steps
            total_steps += steps
            prompt_slots += len(reqs) * width
            pad_slots += sum(width - n for n in real)
            stamps = [now + (t - t0) for t in clock.times]
            for i, r, row, n_prompt in zip(batch, reqs, new, real):
                toks = row[: r.max_tokens]
                if not r.ignore_eos:
                    cut = next((k for k, t in enumerate(toks) if t in self.eos_ids), None)
                    if cut is not None:
                        toks = toks[: cut + 1]
                if r.ignore_eos:  # guards against a transformers that stops at EOS anyway
                    assert len(toks) == r.max_tokens, (r.name, len(toks), r.max_tokens)
                done[i] = BaselineRequest(
                    name=r.name or f"req-{i}", prompt=r.prompt, max_tokens=r.max_tokens,
                    ignore_eos=r.ignore_eos, prompt_tokens=int(n_prompt), token_ids=toks,
                    text=self.tokenizer.decode(toks), batch_index=batch_index,
                    arrival_s=r.arrival_s, start_s=now, first_token_s=stamps[0],
                    last_token_s=stamps[max(len(toks), 1) - 1], done_s=now + (t_end - t0),
                )
            now += t_end - t0
            batch_index += 1
            if progress is not None:
                progress(len(done) / len(items),
                         f"batch {batch_index}: {len(reqs)} requests, {steps} steps")

        name = workload.name if isinstance(workload, Workload) else "custom"
        return BaselineResult(
            model=self.model_name, device=self.device, dtype=str(self.dtype).removeprefix(
                "torch."), batch_size=self.batch_size, workload=name, wall_s=now,
            row_steps=row_steps, steps=total_steps, prompt_slots=prompt_slots,
            prompt_pad_slots=pad_slots,
            max_concurrency=max_conc, requests=[done[i] for i in range(len(items))],
        )


def reference_greedy(prompts_or_ids, max_new_tokens: int, model: str = "smollm2-135m",
                     ignore_eos: bool = True, dtype: torch.dtype | str = torch.float32,
                     device: str = "cpu") -> list[list[int]]:
    """Greedy new token ids from HF generate, one prompt at a time, no padding.

    `prompts_or_ids`: a text, a list of token ids, or a list of either. Texts are tokenized
    as they are (the tokenizer's default special tokens; SmolLM2 adds none). Always returns
    one list of new ids per prompt. With `ignore_eos` exactly `max_new_tokens` come back
    (EOS may appear inside); without it generation stops after the first EOS, which is kept.
    """
    if isinstance(prompts_or_ids, str) or (
            isinstance(prompts_or_ids, (list, tuple)) and prompts_or_ids
            and all(isinstance(t, int) for t in prompts_or_ids)):
        prompts_or_ids = [prompts_or_ids]
    hf, tok = load_hf(model, dtype, device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(_eos_ids(hf), default=0)
    outs = []
    for p in prompts_or_ids:
        ids = tok(p).input_ids if isinstance(p, str) else list(p)
        if not ids:
            raise ValueError("reference_greedy needs a non-empty prompt")
        input_ids = torch.tensor([ids], device=hf.device)
        enc = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        out = _generate(hf, enc, max_new_tokens, ignore_eos, pad)
        outs.append(out[0, len(ids):].tolist())
    return outs
