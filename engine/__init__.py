"""ServeLab's inference engine: a real paged-KV, continuous-batching engine, steppable.

Where the chapter's three fixes live (chapter 6.4: three leaks of naive serving):
  1. continuous batching (leak 1, idle seats)     scheduler.py: static "tour bus" vs "subway"
  2. paged KV (leak 2, reserved and scattered KV)  kv/paged.py vs kv/contiguous.py (+ kv/pool.py)
  3. speculative decoding (leak 3, idle compute)   spec/: ngram.py, draft.py, rejection.py,
                                                   decoder.py (draft before, verify after),
                                                   eagle.py + train_draft.py (the apprentice:
                                                   a one-layer head on the target's features)

How one `LLMEngine.step()` flows (engine.py):
  spec/decoder.propose    drafts k tokens for each decoding request (if speculation is on)
  Scheduler.schedule      who rides and how many tokens each computes; KV slots; preemption
  ModelRunner.run         the flat batch -> input ids, positions, slot mapping, block tables
                          (runner.py) -> one forward of model/llama.py -> logits (and, for
                          the EAGLE head, every token's hidden state: spec/decoder.observe);
                          a decode-only step may replay a CUDA graph instead (graphs.py)
  LLMEngine._sample       sampler.py (one token) or spec/decoder.verify (accepted drafts)
  Scheduler.update_from_output   the one place a request advances: computed tokens, new
                          tokens up to a stop (detokenizer.py), KV kept or rolled back, finish
  report.build_report     the StepReport the app draws (seats, queue, KV map, drafts)

Other files: config.py (the switches and sizes), request.py (one request's state),
sampler.py, metrics.py (TTFT, TPOT, throughput, KV use), generate.py (a command-line
client), server/ (the OpenAI-compatible server), model/ (loading, the forward, attention
backends, the CPU kernels). The benchmarks live apart, in `benchmarks/`.
"""

import os

# OpenMP's idle worker threads (torch's libgomp) spin SPINCOUNT rounds, tens of microseconds,
# then sleep: long enough to stay awake between the ops of one step, short enough to give the
# core back between steps, when a server's HTTP thread has tokens to send. libgomp's default
# spins far longer, and OMP_WAIT_POLICY=ACTIVE alone never stops (a benchmark's choice): on a
# small machine a server decodes much slower with either (docs/performance.md). ACTIVE keeps
# the count whole where libgomp manages more threads than there are cores (a server may: two
# of its threads run torch ops); without it libgomp cuts the count short. Read once, when torch loads; an explicit OMP_WAIT_POLICY or
# GOMP_SPINCOUNT wins. Set for this process only, and taken out again once torch has loaded,
# so a child process (a benchmark's re-exec, a server) makes its own choice.
SPINCOUNT = "3000"
_spin_set = "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ
if _spin_set:
    os.environ.update(OMP_WAIT_POLICY="ACTIVE", GOMP_SPINCOUNT=SPINCOUNT)

from engine.config import EngineConfig, SamplingParams, SpecConfig  # noqa: E402
from engine.engine import LLMEngine, RequestOutput  # noqa: E402
from engine.report import StepReport  # noqa: E402

if _spin_set:  # torch, and with it libgomp, is loaded by now and has read both
    del os.environ["GOMP_SPINCOUNT"], os.environ["OMP_WAIT_POLICY"]


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The environment for an engine server started as a child process: the parent's, less
    its OpenMP wait policy (a benchmark's ACTIVE, the app's PASSIVE), so that the server's own
    short spin (SPINCOUNT) applies."""
    return {k: v for k, v in env.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}


__all__ = ["LLMEngine", "EngineConfig", "SamplingParams", "SpecConfig", "RequestOutput",
           "StepReport"]
