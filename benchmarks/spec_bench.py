"""`python -m benchmarks.spec_bench --json PATH [--quick]`: what speculation buys, measured.

Speculative decoding (Leviathan et al. 2023; prompt lookup, Saxena 2023) trades extra work
for fewer steps: one target forward over [last, x_1..x_k] costs about as much as over one
token while decoding is bound by reading the weights, so every accepted draft token is
nearly free. Two measurements here:

1. `forward_cost`: the target's forward time at batch 1 for 1, 2, 4, 8, 16 tokens per
   forward (with the logits of every row, as verification needs them). Flat means
   verification is free; where it bends upward the step stops being bound by weight reads.
2. `draft_step`: one draft step at batch 1 (one token after 128 of context, with its
   readout), relative to the target's one-token forward: the int4 twin (`draft`) and the
   EAGLE head (`eagle`, engine/spec/eagle.py), the apprentice whose goal is <= 0.15x.
3. `results`: output tokens/s with speculation off, prompt lookup (`ngram`), the int4 twin
   (`draft`) and the EAGLE head (`eagle`; skipped with a note until `python -m
   engine.spec.train_draft` has trained it) on the `grounded` (copy-heavy) and `open`
   (creative) workloads with 1, 4,
   16 and 32 requests running at once, greedy, every request generating exactly
   `--max-tokens` tokens (EOS ignored) so every method does identical work. More requests
   per step make the step compute-bound and leave less idle bandwidth for drafts to use:
   speculation helps most at batch 1 and can hurt at 32. A method named with `+adaptive`
   (`--methods off,eagle,eagle+adaptive`) runs with adaptive k: each step drafts the k,
   0..`--k`, the engine expects to give the most tokens per second; its results add the
   share of decode steps run at each k (`k_share`). `+lookup` (`eagle+lookup`,
   `eagle+lookup+adaptive`) puts prompt lookup in front of the model: requests whose text
   has an n-gram match this step draft by lookup, the others by the model.

The JSON has the main bench's shape (`benchmarks/bench.py`): {"machine", "roofline", "results",
"forward_cost", ...}; each result has the common keys plus `workload`, `concurrency`,
`acceptance_rate` (accepted / drafted), `a` (the lesson's per-token acceptance: accepted /
(accepted + first rejections), as the speculation page computes it), `mean_accepted_len`,
`speedup_vs_off`. `python -m benchmarks.bench --spec`
runs this. Methods run interleaved per concurrency on the same prompts; the machine is shared
and noisy, so compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

import torch

from benchmarks.common import (
    roofline,
    seconds,
    sequence_batch,
    serve,
    spin_openmp_threads,
    write_json,
)
from benchmarks.workloads import get_workload
from engine.config import (
    DEVICES,
    DTYPES,
    SPEC_MODES,
    WEIGHTS,
    EngineConfig,
    SamplingParams,
    SpecConfig,
)
from engine.metrics import RunMetrics

METHODS = SPEC_MODES
ADAPTIVE = "+adaptive"  # "eagle+adaptive": the method with adaptive k (engine/spec/adaptive.py)
LOOKUP = "+lookup"  # "eagle+lookup": prompt lookup first, the model where it finds no match
CONFIDENCE = "@"  # "eagle@0.5": the head stops drafting below probability 0.5 (min_confidence)
# the speedup goals speculation is held to at batch 1: 1.5x on open prompts, 2x on grounded ones
GOALS = (1.5, 2.0)


class Method(NamedTuple):
    base: str
    lookup: bool
    adaptive: bool
    min_confidence: float | None  # None: the bench's --min-confidence


def parse_method(name: str) -> Method:
    """'eagle+lookup+adaptive' -> ('eagle', lookup first, adaptive k, None); an eagle method
    may end in '@P', its own min_confidence ('eagle+lookup+adaptive@0.5'), so that heads
    with and without the confidence stop run side by side. ValueError if unknown."""
    name, at, conf = name.partition(CONFIDENCE)
    base, *flags = name.split("+")
    flags = ["+" + f for f in flags]
    if (base not in METHODS or len(set(flags)) != len(flags)
            or any(f not in (ADAPTIVE, LOOKUP) for f in flags)
            or (base == "off" and flags) or (base == "ngram" and LOOKUP in flags)
            or (at and base != "eagle")):
        raise ValueError(name + at + conf)
    try:
        p = float(conf) if at else None
    except ValueError:
        raise ValueError(name + at + conf) from None
    if p is not None and not 0.0 <= p < 1.0:
        raise ValueError(name + at + conf)
    return Method(base, LOOKUP in flags, ADAPTIVE in flags, p)


def forward_cost(model, pool, backend, device, tokens=(1, 2, 4, 8, 16), context: int = 128,
                 reps: int = 7) -> list[dict]:
    """Milliseconds of one forward of `n` new tokens after `context` cached ones, batch 1,
    logits for every new row; the minimum over `reps` interleaved repetitions."""
    bs = pool.block_size
    assert -(-(context + max(tokens)) // bs) <= pool.num_blocks, \
        "pool too small for the forward-cost probe"

    def forward(batch):  # [rows, vocab]: the logits of every new token, as verification needs
        return model.logits(model.forward(*batch, pool.layers, backend))

    best = dict.fromkeys(tokens, float("inf"))
    gen = torch.Generator().manual_seed(0)
    for _ in range(reps):
        for n in tokens:
            ids = torch.randint(0, 1000, (context + n,), generator=gen).tolist()
            # the context's K/V first (untimed), then the probe: n new tokens after it
            model.forward(*sequence_batch(ids, 0, bs, device), pool.layers, backend)
            probe = sequence_batch(ids, context, bs, device)
            best[n] = min(best[n], seconds(forward, probe, device=device))
    one = best[tokens[0]]
    return [{"tokens": n, "ms": best[n] * 1e3, "vs_one_token": best[n] / one} for n in tokens]


def speedup_bound(cost: list[dict], draft_ratio: float, a: float = 1.0, k_max: int = 15,
                  ) -> dict:
    """The lesson's speedup at batch 1 from measured costs: drafting k tokens and verifying
    k + 1 in one pass gives E(k) = 1 + a + ... + a^k tokens for T(k + 1) + k * d of time,
    against 1 token per T(1) without speculation:

        speedup(k) = E(k) / (T(k + 1) / T(1) + k * draft_ratio)

    T(n) / T(1) is `forward_cost`'s curve (its "vs_one_token", or "ms" over the first
    row's), linear between its measured sizes (none past the largest); draft_ratio = d / T(1),
    one draft step's cost. With a = 1 (every draft accepted) this is the most any draft of
    that cost could give here: the best k and its speedup."""
    pts = [(c["tokens"], c["vs_one_token"] if "vs_one_token" in c else c["ms"] / cost[0]["ms"])
           for c in cost]

    def t_ratio(n: int) -> float | None:
        for (n0, r0), (n1, r1) in zip(pts, pts[1:]):
            if n0 <= n <= n1:
                return r0 + (r1 - r0) * (n - n0) / (n1 - n0)
        return None

    best = {"k": 0, "speedup": 1.0}
    for k in range(1, k_max + 1):
        t = t_ratio(k + 1)
        if t is None:
            break
        s = sum(a ** i for i in range(k + 1)) / (t + k * draft_ratio)
        if s > best["speedup"]:
            best = {"k": k, "speedup": s}
    return {"a": a, "draft_ratio": draft_ratio, **best}


def needed_acceptance(cost: list[dict], draft_ratio: float, goal: float) -> float | None:
    """The smallest per-token acceptance a (to 0.01) at which a draft of this cost reaches
    `goal`x at batch 1 (`speedup_bound`, its best k); None when no a <= 1 does. The bound
    grows with a, so the first a that reaches the goal is the answer."""
    for hundredths in range(101):
        a = hundredths / 100
        if speedup_bound(cost, draft_ratio, a=a)["speedup"] >= goal:
            return a
    return None


def head_cost(proposer, context: int = 128, reps: int = 7) -> float:
    """Milliseconds of one EAGLE draft step at batch 1: one head forward of one token after
    `context` positions of its own KV, plus the reduced readout and the argmax (what each
    drafted token costs in `EagleProposer.propose`); the minimum over `reps`."""
    import time

    from engine.spec.eagle import HeadSeq

    head = proposer.head
    gen = torch.Generator().manual_seed(0)
    seq = HeadSeq("probe")
    assert proposer.allocator.ensure_slots(seq, context + 1), "pool too small for the probe"
    feats = torch.randn(context + 1, head.cfg.hidden_size, generator=gen).to(head.dtype)
    toks = torch.randint(0, 1000, (context + 1,), generator=gen).tolist()
    proposer._forward([seq], [0], [feats[:context]], [toks[:context]])
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        h = proposer._forward([seq], [context], [feats[context:]], [toks[context:]])
        int(head.logits(h).argmax(-1)[0])
        best = min(best, time.perf_counter() - t0)
    proposer.allocator.free(seq)
    return best * 1e3


def _run(engine, items, max_tokens: int) -> dict:
    """Serve `items` all at once on a warm engine; the engine's metrics are reset first.

    Requests stop at EOS: decoding is greedy and speculation lossless, so every method emits
    exactly the same tokens (identical work), and no method is measured on the text a small
    model invents after its answer ended."""
    engine.metrics = RunMetrics()
    return serve(engine, [(0.0, it.prompt, SamplingParams(
        max_tokens=min(it.max_tokens, max_tokens), ignore_eos=False)) for it in items])


def print_table(results: list[dict]) -> None:
    print(f"{'workload':<10}{'conc':>5}  {'spec':<22}{'tok/s':>8}{'speedup':>9}{'accept':>8}"
          f"{'a':>6}{'acc len':>8}{'steps':>7}  k (share of decode steps)")
    for r in results:
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        alen = "-" if r["mean_accepted_len"] is None else f"{r['mean_accepted_len']:.2f}"
        a = "-" if r.get("a") is None else f"{r['a']:.2f}"
        speedup = "-" if r["speedup_vs_off"] is None else f"{r['speedup_vs_off']:.2f}x"
        ks = " ".join(f"{k}:{v:.2f}" for k, v in (r.get("k_share") or {}).items())
        print(f"{r['workload']:<10}{r['concurrency']:>5}  {r['spec'] or 'off':<22}"
              f"{r['output_tok_per_s']:>8.1f}{speedup:>9}{acc:>8}{a:>6}{alen:>8}"
              f"{r['steps']:>7}  {ks}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spec_bench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="a small run (about a minute)")
    ap.add_argument("--workloads", default="grounded,open")
    ap.add_argument("--concurrency", help="requests running at once (default 1,4,16,32; "
                                          "--quick: 1,4)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="off, ngram, draft, eagle; add +adaptive for adaptive k "
                         "(eagle+adaptive), +lookup for prompt lookup in front of draft or "
                         "eagle (eagle+lookup+adaptive), @P for eagle's own min_confidence "
                         "(eagle+lookup+adaptive@0.5)")
    ap.add_argument("--k", type=int, default=SpecConfig().num_speculative_tokens,
                    help="num_speculative_tokens")
    ap.add_argument("--min-confidence", type=float, default=SpecConfig().min_confidence,
                    help="eagle: stop drafting below this head probability (dynamic k)")
    ap.add_argument("--max-tokens", type=int, help="output tokens per request (48; --quick: 16)")
    ap.add_argument("--min-requests", type=int,
                    help="requests per run: max(concurrency, this) (4; --quick: 2)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="serve each workload this many times per engine and keep the fastest "
                         "run (a batch-1 run lasts under a second: one busy moment of a shared "
                         "machine can decide it)")
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--dtype", default="auto", choices=DTYPES)
    ap.add_argument("--weights", default="auto", choices=WEIGHTS,
                    help="EngineConfig(weights=...): gguf-q8 makes verification rows cheaper")
    ap.add_argument("--device", default="auto", choices=DEVICES)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default). On a shared machine 1 thread "
                         "is steadier: two threads stall each other when a core is taken")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.threads:
        torch.set_num_threads(args.threads)
    quick = {"concurrency": "1,4", "max_tokens": 16, "min_requests": 2}
    full = {"concurrency": "1,4,16,32", "max_tokens": 48, "min_requests": 4}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    from engine.engine import LLMEngine

    concurrency = [int(c) for c in args.concurrency.split(",")]
    methods = args.methods.split(",")
    workloads = args.workloads.split(",")
    for m in methods:
        try:
            parse_method(m)
        except ValueError:
            ap.error(f"--methods: {m!r} is not one of {list(METHODS)} (or draft / eagle with "
                     f"{LOOKUP}, any but off with {ADAPTIVE}, eagle ending in "
                     f"{CONFIDENCE}P with P in [0, 1))")
    from engine.spec.eagle import TRAIN_COMMAND, head_info

    eagle_methods = [m for m in methods if parse_method(m)[0] == "eagle"]
    eagle_info = head_info() if eagle_methods else None
    if eagle_methods and eagle_info is None:
        print(f"eagle: skipped, the draft head is not trained yet (run `{TRAIN_COMMAND}`)")
        methods = [m for m in methods if m not in eagle_methods]

    def config(method: str, seats: int) -> EngineConfig:
        base, lookup, adaptive, conf = parse_method(method)
        conf = (args.min_confidence if conf is None else conf) if base == "eagle" else 0.0
        spec = None if method == "off" else SpecConfig(
            base, args.k, min_confidence=conf, adaptive_k=adaptive, prompt_lookup_first=lookup)
        return EngineConfig(max_num_seqs=seats, max_model_len=args.max_model_len,
                            max_num_batched_tokens=max(512, seats * (args.k + 1)),
                            dtype=args.dtype, weights=args.weights, device=args.device,
                            spec=spec)

    has_draft = any(parse_method(m)[0] == "draft" for m in methods)
    probe = LLMEngine(config("draft" if has_draft else "off", 1))
    roof = roofline(probe)
    plan = probe.plan  # the JSON records how the measured engine ran
    print(f"[{probe.describe()}] weights {roof['weight_bytes'] / 1e6:.0f} MB")
    reps = 3 if args.quick else 7
    cost = forward_cost(probe.model, probe.pool, probe.backend, probe.device, reps=reps)
    print("target forward at batch 1: " + ", ".join(
        f"{c['tokens']} tok {c['ms']:.1f} ms ({c['vs_one_token']:.2f}x)" for c in cost))
    draft_cost, draft_step = None, {}
    if probe.spec_decoder is not None:
        draft = probe.spec_decoder.draft
        roof["draft_weight_bytes"] = draft.model.weight_bytes
        draft_cost = forward_cost(draft.model, draft.pool, probe.backend, probe.device,
                                  tokens=(1, 4, 16), reps=reps)
        print("draft forward at batch 1: " + ", ".join(
            f"{c['tokens']} tok {c['ms']:.1f} ms ({c['ms'] / cost[0]['ms']:.2f}x target's "
            f"1-token forward)" for c in draft_cost))
        draft_step["draft"] = {"ms": draft_cost[0]["ms"],
                               "vs_target": draft_cost[0]["ms"] / cost[0]["ms"],
                               "weight_bytes": draft.model.weight_bytes}
    device_type = probe.device.type
    del probe
    if eagle_methods and eagle_info is not None:
        eprobe = LLMEngine(config("eagle", 1))
        head = eprobe.spec_decoder.draft.head
        # the target's one-token forward again, interleaved with the head's, for the ratio
        ms = min(head_cost(eprobe.spec_decoder.draft, reps=reps) for _ in range(2))
        target_ms = forward_cost(eprobe.model, eprobe.pool, eprobe.backend, eprobe.device,
                                 tokens=(1,), reps=reps)[0]["ms"]
        ms = min(ms, head_cost(eprobe.spec_decoder.draft, reps=reps))
        draft_step["eagle"] = {"ms": ms, "vs_target": ms / target_ms, "target_ms": target_ms,
                               "weight_bytes": head.weight_bytes, "params": head.num_params,
                               "readout_params": head.readout_params,
                               "vocab": int(len(head.vocab)), "trained": eagle_info}
        print(f"eagle head step at batch 1: {ms:.2f} ms ({ms / target_ms:.3f}x the target's "
              f"{target_ms:.1f} ms one-token forward); {head.num_params / 1e6:.1f}M parameters "
              f"+ a {len(head.vocab)}-token readout")
        del eprobe
    # what any draft of each cost could give at batch 1 if every token were accepted
    bounds = {name: speedup_bound(cost, ratio) for name, ratio in
              [("free (prompt lookup)", 0.0)]
              + [(name, step["vs_target"]) for name, step in draft_step.items()]}
    for name, b in bounds.items():
        print(f"batch-1 speedup bound, every draft accepted, {name}: {b['speedup']:.2f}x at "
              f"k = {b['k']}")
        # and the a this draft would need for each goal
        b["needed_a"] = {str(g): needed_acceptance(cost, b["draft_ratio"], g) for g in GOALS}
        print(f"  {name}: needs a >= " + ", ".join(
            f"{a:.2f} for {g}x" if a is not None else f"(none) for {g}x"
            for g, a in b["needed_a"].items()))

    results = []
    warm = get_workload("open", 1).items
    for seats in concurrency:
        for method in methods:
            engine = LLMEngine(config(method, seats))
            _run(engine, warm, 4)  # warm up kernels and caches
            for wl_name in workloads:
                items = get_workload(wl_name, max(seats, args.min_requests)).items
                res = None
                for _ in range(args.repeats):  # the same tokens each time: keep the fastest
                    run = _run(engine, items, args.max_tokens)
                    run["k_share"] = engine.metrics.snapshot()["k_share"]
                    if res is None or run["output_tok_per_s"] > res["output_tok_per_s"]:
                        res = run
                res["repeats"] = args.repeats
                res.update({"system": "engine", "batching": engine.config.batching,
                            "kv_layout": engine.config.kv_layout,
                            "spec": None if method == "off" else method, "k": args.k,
                            "workload": wl_name, "concurrency": seats,
                            "requests": len(items)})
                results.append(res)
                print(f"  {wl_name:<9} {seats:>3} running, {method:<22}: "
                      f"{res['output_tok_per_s']:6.1f} tok/s", flush=True)
            del engine
    for r in results:
        off = next((o for o in results if o["spec"] is None and o["workload"] == r["workload"]
                    and o["concurrency"] == r["concurrency"]), None)
        r["speedup_vs_off"] = r["output_tok_per_s"] / off["output_tok_per_s"] if off else None
    results.sort(key=lambda r: (workloads.index(r["workload"]), r["concurrency"],
                                methods.index(r["spec"] or "off")))
    print_table(results)
    write_json(args.json, device_type, args, plan=plan, roofline=roof, forward_cost=cost,
               draft_forward_cost=draft_cost, draft_step=draft_step, speedup_bound=bounds,
               results=results)
    return 0


if __name__ == "__main__":
    spin_openmp_threads("benchmarks.spec_bench")
    sys.exit(main())
