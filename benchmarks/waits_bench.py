"""What the reasons cost (engine/waits.py): engine steps with every waiting request's code
against steps without, in one run, alternating, at a crowded door (by default 256 running and
1,000 waiting).

    python -m benchmarks.waits_bench [--running 256] [--waiting 1000] [--steps 6] [--json PATH]

One engine (fp32, continuous batching, paged KV) is filled to `--running` decoding requests
with `--waiting` more at the door (none of them can board: every seat is taken, so the queue
stays as long through the run). Then pairs of steps, reasons on and off in turn (the
scheduler's `explain_waits`), each timed whole (`LLMEngine.step`, the report included); the
figure is the ratio of the two medians. The reasons' own pass over the queue (the scheduler's
`_waiting_reasons`) is then timed alone, so their cost shows apart from the model's, which
the step medians' noise can hide."""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import machine_info, spin_openmp_threads, write_json


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.waits_bench", description=__doc__)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--waiting", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=6, help="steps of each kind")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    spin_openmp_threads("benchmarks.waits_bench")

    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.scheduler import SchedulerOutput

    n = args.running + args.waiting
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=args.running,
                                 max_model_len=128, max_num_batched_tokens=4096,
                                 num_kv_blocks=args.running * 8 + 16))
    for i in range(n):
        eng.add_request(f"Request {i}: count", SamplingParams(max_tokens=100, ignore_eos=True))
    while len(eng.scheduler.running) < args.running or any(
            r.in_prefill for r in eng.scheduler.running):
        eng.step()
    assert len(eng.scheduler.waiting) == args.waiting
    sched = eng.scheduler
    step_ms: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * args.steps):
        on = i % 2 == 0
        sched.explain_waits = on
        t0 = time.perf_counter()
        report = eng.step()
        step_ms[on].append(1e3 * (time.perf_counter() - t0))
        assert bool(report.waits) == on and len(report.waiting) == args.waiting
    # the reasons' own pass over the queue, alone (what a step with them adds)
    sched.explain_waits = True
    pass_ms = []
    for _ in range(2 * args.steps):
        t0 = time.perf_counter()
        sched._waiting_reasons(SchedulerOutput(), True, 0)
        pass_ms.append(1e3 * (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in step_ms.items()}
    result = {
        "running": args.running, "waiting": args.waiting, "steps_each": args.steps,
        "step_ms_reasons_on": round(med[True], 2), "step_ms_reasons_off": round(med[False], 2),
        "overhead_pct": round(100 * (med[True] / med[False] - 1), 2),
        "reasons_pass_ms": round(statistics.median(pass_ms), 3),
        "machine": machine_info("cpu"),
    }
    print(f"{args.running} running, {args.waiting} waiting: a step takes "
          f"{med[True]:.1f} ms with the reasons, {med[False]:.1f} ms without "
          f"({result['overhead_pct']:+.2f}%); the reasons' pass over the queue "
          f"{result['reasons_pass_ms']:.3f} ms")
    write_json(args.json, "cpu", args, plan=eng.plan, **result)
    return result


if __name__ == "__main__":
    main()
