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
  Sampler.sample          sampler.py (one token, logits processing, logprobs) or
                          spec/decoder.verify (accepted drafts)
  Scheduler.update_from_output   the one place a request advances: computed tokens, new
                          tokens up to a stop (detokenizer.py), KV kept or rolled back, finish
  report.build_report     the StepReport the app draws (seats, queue, KV map, drafts)

Other files: plan.py (how a step runs: device, dtype, weights, kernels, decided once),
threads.py (OpenMP's wait policy and the frozen startup heap, set by the entry points),
config.py (the switches and sizes), inputs.py (add_request's checks: prompt and params ->
Requests), outputs.py (a step's Emitted, a request's RequestOutput), request.py (one
request's state), sampler.py, metrics.py (TTFT, TPOT, throughput, KV use), generate.py (a command-line
client), server/ (the OpenAI-compatible server), model/ (loading, the forward, attention
backends, the CPU kernels). The benchmarks live apart, in `benchmarks/`.
"""

from engine.config import EngineConfig, SamplingParams, SpecConfig

# Importing `engine` has no process-wide side effect: it does not load torch, so an entry
# point can still choose OpenMP's wait policy first (engine/threads.py). The engine's classes
# load on first use.
_LAZY = {"LLMEngine": "engine.engine", "RequestOutput": "engine.outputs",
         "StepReport": "engine.report"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = ["LLMEngine", "EngineConfig", "SamplingParams", "SpecConfig", "RequestOutput",
           "StepReport"]
