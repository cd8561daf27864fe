"""Where an engine step's time goes: the step's phases timed in place, for benchmarks only.

`StepPhases(engine)` wraps the functions that do each phase of `LLMEngine.step()` for as long
as it is open, and adds up their wall time per step:

    schedule    Scheduler.schedule
    metadata    the runner's flat batch and attention metadata (ModelRunner.run minus the two
                model calls below)
    forward     the model's layers (also by CUDA events on a GPU: the device's own time)
    logits      the lm_head
    sampling    sampling and draft verification (Sampler.sample; LLMEngine._sample before)
    detokenize  the requests' Detokenizer calls
    report      building the StepReport
    update      the rest of the step: advancing requests, stop checks, metrics

A phase the engine does not have under these names is listed in `missing`, never guessed.
The names of the code before the step was split into its parts (`_detokenize`, `_report`)
are kept as candidates, so the same bench measures the code before and after.
"""

from __future__ import annotations

import importlib
import time

PHASES = ("schedule", "metadata", "forward", "logits", "sampling", "update", "detokenize",
          "report")

# phase -> candidate (owner, attribute): owner is "engine", an engine attribute, "mod:NAME"
# (a module) or "cls:MODULE.CLASS" (a class: every instance's calls are timed)
CANDIDATES = {
    "schedule": [("scheduler", "schedule")],
    "run": [("runner", "run")],
    "forward": [("model", "forward")],
    "logits": [("model", "logits")],
    "sampling": [("sampler", "sample"), ("engine", "_sample")],
    "detokenize": [("engine", "_detokenize")] + [
        ("cls:engine.detokenizer.Detokenizer", m) for m in ("add", "take", "visible", "finish")],
    "report": [("engine", "_report"), ("mod:engine.engine", "build_report")],
}


class StepPhases:
    """Open around a run of steps; call `begin()` before and `end(total_s)` after each step."""

    def __init__(self, eng, cuda: bool = False):
        self.eng, self.cuda = eng, cuda
        self.step: dict[str, float] = {}
        self.totals = {p: 0.0 for p in PHASES}
        self.steps = 0
        self.gpu_forward_ms = 0.0
        self.missing: list[str] = []
        self._restore: list[tuple[object, str, object]] = []
        self._events: list = []
        self._depth: dict[str, int] = {}

    def _owner(self, name: str):
        if name.startswith("mod:"):
            return importlib.import_module(name[4:])
        if name.startswith("cls:"):
            module, cls = name[4:].rsplit(".", 1)
            try:
                return getattr(importlib.import_module(module), cls)
            except ImportError:
                return None
        return self.eng if name == "engine" else getattr(self.eng, name, None)

    def __enter__(self) -> StepPhases:
        for phase, candidates in CANDIDATES.items():
            found = False
            for owner_name, attr in candidates:
                owner = self._owner(owner_name)
                if owner is None or not hasattr(owner, attr):
                    continue
                found = True
                self._restore.append((owner, attr, vars(owner).get(attr)))
                setattr(owner, attr, self._wrap(phase, getattr(owner, attr)))
            if not found:
                self.missing.append(phase)
        return self

    def __exit__(self, *exc) -> bool:
        for owner, attr, own in reversed(self._restore):
            if own is None:
                delattr(owner, attr)  # an instance's wrapper goes; its class's method shows
            else:
                setattr(owner, attr, own)
        self._restore = []
        return False

    def _wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            if self._depth.get(phase):  # a phase calling itself (visible inside take): once
                return fn(*args, **kwargs)
            self._depth[phase] = 1
            events = None
            import torch

            # no events inside a CUDA graph's capture (the graph runner calls the forward to
            # record it): a captured event cannot be waited on afterwards
            if (phase == "forward" and self.cuda
                    and not torch.cuda.is_current_stream_capturing()):
                events = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
                events[0].record()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.step[phase] = self.step.get(phase, 0.0) + time.perf_counter() - t0
                if events is not None:
                    events[1].record()
                    self._events.append(events)
                self._depth[phase] = 0

        return timed

    def begin(self) -> None:
        self.step = {}

    def end(self, total_s: float) -> dict[str, float]:
        """Close one step that took total_s; returns its phases in seconds."""
        s = self.step
        run = s.pop("run", 0.0)
        s["metadata"] = max(0.0, run - s.get("forward", 0.0) - s.get("logits", 0.0))
        outside = sum(s.get(p, 0.0) for p in ("schedule", "sampling", "detokenize", "report"))
        s["update"] = max(0.0, total_s - run - outside)
        phases = {p: s.get(p, 0.0) for p in PHASES}
        for p, v in phases.items():
            self.totals[p] += v
        self.steps += 1
        return phases

    def collect_gpu(self) -> None:
        """Add up the CUDA events recorded so far (after the steps' own syncs)."""
        for start, stop in self._events:
            stop.synchronize()
            self.gpu_forward_ms += start.elapsed_time(stop)
        self._events.clear()
