"""What every benchmark here shares: the machine it ran on, the roofline it is judged against,
timers, serving a list of requests on an engine, and the JSON it writes.

The chapter's claims are ratios (continuous + paged against the naive server, a verification
pass against a one-token pass), so each bench runs its systems in one process, one after the
other or alternately, and reports the best of several rounds, as `timeit` takes the minimum:
the fastest round is the one least disturbed by the other jobs on this shared machine.
The roofline (Williams, Waterman & Patterson 2009) turns "decode is memory-bound" into a number:
at batch 1 a decode step reads every weight once, so read bandwidth / weight bytes is the
fastest any engine can decode one request.

Every other module of the package imports from here, and this module imports none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine.config import SamplingParams
from engine.model.attention import build_metadata

# the keys every result row has, whichever bench wrote it (the app and the tests read them)
RESULT_KEYS = ("system", "batching", "kv_layout", "spec", "output_tokens", "wall_s",
               "output_tok_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "kv_useful_frac",
               "max_concurrency", "idle_seat_frac", "prefix_hit_rate")


def spin_openmp_threads(module: str) -> None:
    """Run this command again with OMP_WAIT_POLICY=ACTIVE and the engine's GOMP_SPINCOUNT,
    unless the environment sets a policy.

    Between two ops, OpenMP's worker threads either spin (ACTIVE) or go to sleep (PASSIVE), and
    a decode step is hundreds of small ops. A benchmark owns the machine, as a server does,
    so its threads spin between the ops of a step, as an engine server's do (engine/threads.py:
    SPINCOUNT rounds, then sleep, so a bench's idle threads do not take a core from the
    servers it measures); the app shares two cores with its web server and keeps PASSIVE
    (app/main.py). The policy is read once, when torch loads OpenMP, hence the re-exec of
    `python -m module`. docs/performance.md says which policy each figure ran under."""
    if "OMP_WAIT_POLICY" in os.environ:
        return
    from engine.threads import SPINCOUNT

    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    os.environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]])


# the instruction sets that decide either server's kernels, as /proc/cpuinfo names them
CPU_FLAGS = ("amx_tile", "amx_int8", "amx_bf16", "avx512f", "avx512_bf16", "avx512_vnni",
             "avx_vnni", "avx2", "fma", "f16c")


def cpu_description() -> dict:
    """The CPU's model name and which of CPU_FLAGS it has (Linux /proc/cpuinfo)."""
    model, flags = None, set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags]}


def machine_info(device: str = "cpu") -> dict:
    """What a JSON file needs to say about where its numbers were measured."""
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "device": device,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "(unset)")}
    if device == "cpu":  # the CPU's instruction sets, and a matmul path forced by name
        info["cpu"] = cpu_description()
        info["servelab_cpu_isa"] = os.environ.get("SERVELAB_CPU_ISA", "(unset)")
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_json(path: str | None, device: str, args: argparse.Namespace, plan=None,
               **data) -> None:
    """Write a bench's results to `path` (no-op without --json): `data` plus the machine,
    the execution plan (engine/plan.py: `plan`, the engine's that was measured, else the plan
    the default config gets on `device` here), the command's arguments, and when it ran (UTC)."""
    if path:
        if plan is None:
            from engine.config import EngineConfig
            from engine.plan import plan_for

            plan = plan_for(EngineConfig(device=device))
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        out = {"machine": machine_info(device), "plan": plan.as_dict(), "args": vars(args),
               "date": date, **data}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=2))
        print(f"wrote {path}")


# ---------------------------------------------------------------------------------------------
# Timers


def seconds(fn: Callable, *args, reps: int = 1, device: torch.device | None = None) -> float:
    """Seconds per call of fn(*args), averaged over `reps` calls in a row. On CUDA the device
    is synchronized on both sides, so the time covers the kernels and not only their launch."""
    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def best_of(fn: Callable, *args, rounds: int = 5, reps: int = 1,
            device: torch.device | None = None) -> float:
    """Seconds per fn(*args): the best of `rounds` averages over `reps` calls."""
    return min(seconds(fn, *args, reps=reps, device=device) for _ in range(rounds))


def best_interleaved(ways: dict[str, Callable[[], object]], rounds: int, reps: int = 1,
                     device: torch.device | None = None) -> dict[str, float]:
    """Seconds per call of each way, the best of `rounds`; the ways take turns within every
    round, so a slow moment of the machine hits all of them rather than one."""
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for name, fn in ways.items():
            best[name] = min(best[name], seconds(fn, reps=reps, device=device))
    return best


# ---------------------------------------------------------------------------------------------
# The roofline


def memory_read_bandwidth(device: torch.device, nbytes: int = 512 * 2**20, repeats: int = 5,
                          ) -> float:
    """Bytes/s of a large reduction (reads every byte once): the decode floor's denominator."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    return nbytes / best_of(x.sum, rounds=repeats, device=device)


def roofline(engine) -> dict:
    """The engine's weight bytes, this machine's read bandwidth, and the batch-1 decode floor."""
    bw = memory_read_bandwidth(engine.device)
    wb = engine.model.weight_bytes
    return {"weight_bytes": wb, "read_bandwidth_gb_s": bw / 1e9,
            "decode_floor_tok_per_s": bw / wb, "dtype": str(engine.dtype).removeprefix("torch.")}


# ---------------------------------------------------------------------------------------------
# Running an engine


def serve(engine, requests: list[tuple[float, str, SamplingParams]], progress=None) -> dict:
    """Serve `requests` of (arrival_s, prompt, params) on `engine`: each joins when its arrival
    time comes (0: at once) and the engine steps until every request has finished.

    Returns the common result keys from the engine's metrics (reset `engine.metrics` first to
    measure a warm engine again) plus the steps taken; `progress(n)` hears the tokens each step
    emits. Checks that every KV block, the draft's too, came back: a bench that leaks blocks
    would be measuring a shrinking cache."""
    requests = sorted(requests, key=lambda r: r[0])
    t0 = time.perf_counter()
    i = steps = 0
    while i < len(requests) or engine.has_unfinished():
        now = time.perf_counter() - t0
        while i < len(requests) and requests[i][0] <= now:
            arrival_s, prompt, params = requests[i]
            engine.add_request(prompt, params, arrival_time=t0 + arrival_s)
            i += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, requests[i][0] - now))
            continue
        report = engine.step()
        steps += 1
        if progress:
            progress(sum(len(e.token_ids) for e in report.emitted))
    wall = time.perf_counter() - t0
    allocators = {"target": engine.allocator}
    if engine.spec_decoder is not None and engine.spec_decoder.draft is not None:
        allocators["draft"] = engine.spec_decoder.draft.allocator
    for name, alloc in allocators.items():
        held = alloc.num_blocks - alloc.num_free_blocks  # cached blocks count as free
        assert held == 0, f"{held} {name} KV blocks still held after the run"
    snap = engine.metrics_snapshot()
    return {
        "output_tokens": snap["output_tokens"], "wall_s": wall,
        "output_tok_per_s": snap["output_tokens"] / wall, "ttft_p50_s": snap["ttft_p50_s"],
        "ttft_p99_s": snap["ttft_p99_s"], "tpot_p50_s": snap["tpot_p50_s"],
        "kv_useful_frac": snap["kv_useful_frac"], "max_concurrency": snap["peak_concurrency"],
        "mean_concurrency": snap["mean_concurrency"], "idle_seat_frac": snap["idle_seat_frac"],
        "prefix_hit_rate": snap["prefix_hit_rate"], "acceptance_rate": snap["acceptance_rate"],
        "mean_accepted_len": snap["mean_accepted_len"], "a": snap["a"],
        "acceptance_by_position": snap["acceptance_by_position"], "steps": steps,
    }


def decode_rate(engine, batch: int, steps: int = 16, windows: int = 3,
                context: int | None = None) -> float:
    """Tokens/s of steady decode with `batch` requests running (prefill excluded): the fastest
    of `windows` runs of `steps` steps, so a burst of load from another job on this shared
    machine does not decide the figure (as timeit takes the minimum). `context`: each
    request's prompt that many token ids (the KV each step reads), else a short one."""
    params = SamplingParams(max_tokens=windows * steps + 4, ignore_eos=True)
    prompts = [f"Count slowly from {i} upwards:" if context is None else
               [(7 * j + 13 * i) % 3000 + 100 for j in range(context)] for i in range(batch)]
    rids = [engine.add_request(p, params) for p in prompts]
    while any(engine.requests[r].num_output_tokens < 2 for r in rids):
        engine.step()  # prefill and the first decode
    step_s = best_of(engine.step, rounds=windows, reps=steps, device=engine.device)
    while engine.has_unfinished():
        engine.step()
    return batch / step_s


def floor_share(engine, pairs: int = 5, steps: int = 16) -> dict:
    """Batch-1 decode as a share of the memory floor, measured in pairs: the read-bandwidth
    probe, then a window of `steps` decode steps, `pairs` times in turn, a share per pair.

    A shared VM's read bandwidth drifts from minute to minute, and the decode rate with it;
    a floor measured once, minutes from the decode it divides, can put the same engine at a
    third or at four fifths of it (docs/decisions.md#paired-floor-share). Each pair's two figures come
    from the same few hundred milliseconds, each the best of two tries. Returns the median
    share, with the rate and bandwidth of that pair, and every pair's (rate tok/s, GB/s,
    share)."""
    params = SamplingParams(max_tokens=pairs * (steps + 1) + 4, ignore_eos=True)
    rid = engine.add_request("Count slowly from 1 upwards:", params)
    while engine.requests[rid].num_output_tokens < 2:
        engine.step()  # prefill and the first decode
    engine.step()
    wb = engine.model.weight_bytes
    rows = []
    for _ in range(pairs):
        bw = memory_read_bandwidth(engine.device, repeats=2)
        # best of two on both sides: two sums, two windows of steps / 2 steps
        rate = 1.0 / best_of(engine.step, rounds=2, reps=max(1, steps // 2),
                             device=engine.device)
        rows.append((rate, bw / 1e9, rate / (bw / wb)))
    while engine.has_unfinished():
        engine.step()
    mid = sorted(rows, key=lambda r: r[2])[len(rows) // 2]
    return {"share": mid[2], "decode_tok_per_s": mid[0], "read_bandwidth_gb_s": mid[1],
            "pairs": [{"decode_tok_per_s": r, "read_bandwidth_gb_s": b, "share": f}
                      for r, b, f in rows]}


def run_engine(config, workload, progress=None) -> dict:
    """Serve a workload (`benchmarks.workloads.Workload`) on a fresh engine built from `config`
    (an `EngineConfig`); requests join when their arrival time comes."""
    from engine.engine import LLMEngine

    engine = LLMEngine(config)
    res = serve(engine, [(it.arrival_s, it.prompt,
                          SamplingParams(max_tokens=it.max_tokens, ignore_eos=it.ignore_eos))
                         for it in workload.items], progress)
    return {
        "system": "engine", "batching": config.batching, "kv_layout": config.kv_layout,
        "spec": None if config.spec is None else config.spec.method,
        "prefix_caching": config.enable_prefix_caching, "workload": workload.name,
        "requests": len(workload.items), **res,
    }


def teacher_forced_logits(eng, ids: list[int]) -> torch.Tensor:
    """Logits at every position of `ids` ([n, vocab]): one prefill through the engine's model
    and pool, blocks 0, 1, 2, ... (what a request would hold; no allocator)."""
    tokens, positions, meta = sequence_batch(ids, 0, eng.config.block_size, eng.device)
    hidden = eng.model.forward(tokens, positions, meta, eng.pool.layers, eng.backend)
    return eng.model.logits(hidden)


def sequence_batch(token_ids: list[int], start: int, block_size: int, device: torch.device):
    """The model's inputs to run token_ids[start:] as one sequence whose first `start` tokens
    are already in the pool, in blocks 0, 1, 2, ... (a probe's private pool, no allocator):
    (input ids [n - start], positions [n - start], attention metadata)."""
    n = len(token_ids)
    table = list(range(-(-n // block_size)))
    meta = build_metadata([n - start], [n], [table], list(range(start, n)), block_size, device)
    ids = torch.tensor(token_ids[start:], device=device)
    return ids, torch.arange(start, n, device=device), meta
