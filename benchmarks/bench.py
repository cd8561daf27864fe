"""`python -m benchmarks.bench`: the chapter's experiment, measured side by side in one run.

1. Roofline: weight bytes and measured memory read bandwidth -> the batch-1 decode floor;
   batch 1's share of it also measured in pairs, the bandwidth probe and a decode window
   taking turns (`common.floor_share`), since this machine's bandwidth drifts.
2. Decode scaling: tokens/s with 1, 4, 16, 32 requests decoding together; on a CPU in bf16
   also with plain (unpacked) weights, interleaved, for the weight-packing gain.
3. One workload through the naive server (transformers' generate() on static padded batches)
   and through the engine in all four batching x kv_layout combinations under the same KV
   budget, plus prefix caching on `shared-prefix`.
`--spec` runs the speculative decoding benchmark instead (`benchmarks/spec_bench.py`), and
`--peer llama-server` the engine beside llama.cpp's server (`benchmarks/peer.py`; skipped with
a message when no `llama-server` is on PATH).
Ratios matter, not absolute numbers: this machine is shared and noisy, so every system runs
in the same process, one after the other, on the same prompts.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import peer, spec_bench
from benchmarks.common import (  # decode_rate and run_engine: used here and by other benches
    decode_rate,
    floor_share,
    roofline,
    run_engine,
    spin_openmp_threads,
    write_json,
)
from benchmarks.workloads import Workload, get_workload, load_jsonl, with_arrivals
from engine.config import DEVICES, DTYPES, WEIGHTS, EngineConfig


def run_naive(workload: Workload, batch_size: int, dtype: torch.dtype, progress=None) -> dict:
    from benchmarks.baseline import NaiveServer

    server = NaiveServer(dtype=dtype, batch_size=batch_size, device="auto")
    res = server.run(workload, progress=(lambda done, total: None))
    if progress:
        progress(res.output_tokens)
    out = res.summary()
    out.update({"batching": "static", "kv_layout": "contiguous", "spec": None,
                "prefix_caching": False, "kv_useful_frac": None, "prefix_hit_rate": None})
    return out


def print_table(results: list[dict]) -> None:
    cols = [("system", 7), ("workload", 13), ("batching", 10), ("kv_layout", 10),
            ("prefix_caching", 6), ("output_tok_per_s", 9), ("ttft_p50_s", 8), ("tpot_p50_s", 8),
            ("kv_useful_frac", 7), ("max_concurrency", 5), ("idle_seat_frac", 6)]
    heads = ["system", "workload", "batching", "kv", "prefix", "tok/s", "TTFT50", "TPOT50",
             "KVuse", "conc", "idle"]
    print("  ".join(h.ljust(w) for h, (_, w) in zip(heads, cols)))
    for r in results:
        cells = []
        for key, w in cols:
            v = r.get(key)
            if isinstance(v, float):
                v = f"{v:.3f}" if v < 10 else f"{v:.1f}"
            cells.append(str("-" if v is None else v)[:w].ljust(w))
        print("  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    # no abbreviations: `--spec --k 2` must reach the spec bench's --k, not become --kv-budget
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench",
                                 description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--workload", default="longtail", help="longtail, uniform, shared-prefix, ...")
    ap.add_argument("--workload-file", help="JSONL lines {\"prompt\": ..., \"max_tokens\": ...}")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--seats", type=int, default=16, help="max_num_seqs (and naive batch size)")
    ap.add_argument("--kv-budget", type=int, default=4,
                    help="KV pool size, in full-length (max_model_len) requests")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=8,
                    help="KV slots per block (8: longtail's requests are ~80 tokens)")
    ap.add_argument("--arrivals", default="all-at-once", choices=["all-at-once", "poisson"])
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    ap.add_argument("--dtype", default="auto", choices=DTYPES)
    ap.add_argument("--weights", default="auto", choices=WEIGHTS,
                    help="the engine's weights: dense tensors, the GGUF file's own blocks, or "
                         "those with int8 or int16 activations (gguf-q8, gguf-q16)")
    ap.add_argument("--device", default="auto", choices=DEVICES)
    ap.add_argument("--concurrency", default="1,4,16,32", help="decode scaling batch sizes")
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a small run (about a minute)")
    ap.add_argument("--spec", action="store_true", help="run the speculative decoding bench")
    ap.add_argument("--peer", choices=peer.PEERS,
                    help="the engine beside this server instead (benchmarks/peer.py; its own "
                         "flags: python -m benchmarks.peer --help)")
    ap.add_argument("--json", help="write the results here")
    args, rest = ap.parse_known_args(argv)
    if args.spec:
        return spec_bench.main(rest + (["--quick"] if args.quick else [])
                               + (["--json", args.json] if args.json else [])
                               + ["--dtype", args.dtype, "--weights", args.weights])
    if args.peer:
        if args.arrivals != "all-at-once":
            ap.error("--peer sends every request at once (no --arrivals)")
        # the same workload and sizes as this bench (the engine's KV pool: seats x length)
        return peer.main(rest + ["--peer", args.peer, "--workload", args.workload,
                                 "--requests", str(args.requests), "--seats", str(args.seats),
                                 "--max-model-len", str(args.max_model_len),
                                 "--block-size", str(args.block_size), "--dtype", args.dtype]
                         + (["--device", args.device] if args.device != "auto" else [])
                         + (["--weights", args.weights] if args.weights != "auto" else [])
                         + (["--quick"] if args.quick else [])
                         + (["--workload-file", args.workload_file] if args.workload_file else [])
                         + (["--out", args.json] if args.json else []))
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    from tqdm.auto import tqdm

    from engine.engine import LLMEngine
    from engine.model.hardware import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    if args.quick:
        args.requests, args.concurrency = min(args.requests, 8), "1,4"
    wl = load_jsonl(args.workload_file) if args.workload_file else get_workload(
        args.workload, n=args.requests, max_tokens_scale=0.25 if args.quick else 1.0)
    wl = with_arrivals(wl, args.arrivals, rate=args.rate if args.arrivals == "poisson" else None)
    base = dict(model="smollm2-135m", max_num_seqs=args.seats, block_size=args.block_size,
                max_model_len=args.max_model_len, device=args.device, dtype=args.dtype,
                weights=args.weights,
                num_kv_blocks=args.kv_budget * -(-args.max_model_len // args.block_size),
                max_num_batched_tokens=max(512, args.seats))

    probe = LLMEngine(EngineConfig(**{**base, "max_num_seqs": 32, "num_kv_blocks": None}))
    roof = roofline(probe)
    plan = probe.plan  # the JSON records how the measured engine ran
    print(f"[{probe.describe()}] weights {roof['weight_bytes'] / 1e6:.0f} MB, read bandwidth "
          f"{roof['read_bandwidth_gb_s']:.1f} GB/s -> decode floor "
          f"{roof['decode_floor_tok_per_s']:.1f} tok/s at batch 1")
    # plain (unpacked) weights alongside, step for step, so the packing gain is a same-run ratio
    plain = None
    if probe.model.packed and not args.quick:
        plain = LLMEngine(EngineConfig(**{**base, "max_num_seqs": 32, "num_kv_blocks": None,
                                          "pack_weights": False}))
    scaling = []
    for b in [int(x) for x in args.concurrency.split(",")]:
        rate = decode_rate(probe, b)
        row = {"batch": b, "decode_tok_per_s": rate}
        line = f"decode with {b:3d} running: {rate:7.1f} tok/s"
        if b == 1:
            line += f"  ({rate / roof['decode_floor_tok_per_s']:.0%} of the floor)"
            # the floor again, paired with decode windows: the share this machine's drift
            # cannot bend (benchmarks.common.floor_share)
            paired = floor_share(probe)
            row["floor_share_paired"] = paired
            line += (f"; paired with the bandwidth: {paired['share']:.0%} (median of "
                     f"{len(paired['pairs'])}: " + ", ".join(
                         f"{p['decode_tok_per_s']:.0f} tok/s at {p['read_bandwidth_gb_s']:.0f} "
                         f"GB/s" for p in paired["pairs"]) + ")")
        if plain is not None:
            row["plain_weights_tok_per_s"] = decode_rate(plain, b)
            line += f"; plain weights {row['plain_weights_tok_per_s']:.1f} tok/s"
        scaling.append(row)
        print(line)
    roof["decode_scaling"] = scaling
    del probe, plain

    # the engine with both fixes runs right after the naive server: this shared machine's
    # speed drifts over minutes, and that pair gives the headline ratio
    runs = [("continuous", "paged", False), ("static", "contiguous", False),
            ("static", "paged", False), ("continuous", "contiguous", False)]
    if wl.name == "shared-prefix":
        runs.append(("continuous", "paged", True))
    results = []
    with tqdm(total=wl.total_max_tokens * (len(runs) + (not args.skip_naive)), unit="tok",
              desc=f"{wl.name}: {len(wl)} requests") as bar:
        if not args.skip_naive:
            dtype = resolve_dtype(args.dtype, device, weights=args.weights)
            results.append({**run_naive(wl, args.seats, dtype, bar.update),
                            "workload": wl.name})
        for batching, layout, caching in runs:
            cfg = EngineConfig(**base, batching=batching, kv_layout=layout,
                               enable_prefix_caching=caching)
            results.append(run_engine(cfg, wl, bar.update))
    order = ["naive", "static/contiguous", "static/paged", "continuous/contiguous",
             "continuous/paged"]
    print_table(sorted(results, key=lambda r: (
        order.index("naive" if r["system"] == "naive" else f"{r['batching']}/{r['kv_layout']}"),
        r["prefix_caching"])))
    naive = next((r for r in results if r["system"] == "naive"), None)
    best = next(r for r in results if r["batching"] == "continuous" and r["kv_layout"] == "paged")
    contig = next(r for r in results if r["batching"] == "continuous"
                  and r["kv_layout"] == "contiguous")
    if naive:
        print(f"engine (continuous + paged) / naive server: "
              f"{best['output_tok_per_s'] / naive['output_tok_per_s']:.1f}x output tok/s")
    print(f"peak concurrency, same KV budget: paged {best['max_concurrency']} vs contiguous "
          f"{contig['max_concurrency']}")
    write_json(args.json, device.type, args, plan=plan, roofline=roof, workload=wl.name,
               results=results)
    return 0


if __name__ == "__main__":
    spin_openmp_threads("benchmarks.bench")
    sys.exit(main())
