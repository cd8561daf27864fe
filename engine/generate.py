"""Command line: `python -m engine.generate "prompt" [--max-tokens N] [--temperature T] [--trace]`.

Streams the answer as the engine steps. `--trace` prints one compact line per step instead
(who sits in which seat, what each computed, blocks used): the text version of the app.

The engine's flags are `engine.serve`'s, from `EngineConfig` (`EngineConfig.add_cli_args`:
the same names, defaults and choices, `--engine-config` too), but for `--seed`, which here is
the requests' own seed (`SamplingParams.seed`). `--spec METHOD --k N` is a short form of
`--speculative-config '{"method": METHOD, "num_speculative_tokens": N}'`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from engine.config import SPEC_MODES, EngineConfig, SamplingParams, SpecConfig


def trace_line(report) -> str:
    seats = " ".join(
        "[" + ("  ." if s.request_id is None else
               f"{s.request_id}{'*' if s.state == 'idle-finished' else ''}+{s.computed_this_step}")
        + "]" for s in report.seats)
    kv = report.kv
    used_blocks = kv.num_blocks - kv.free_blocks
    extra = ""
    for rec in report.spec:
        marks = "".join("✓" if d.accepted else "✗" for d in rec.drafted)
        extra += f" {rec.request_id}:{marks}+{rec.next_kind[0]}"
    return (f"step {report.step:4d} {report.wall_s * 1000:7.1f} ms  tokens {report.num_batched_tokens:4d}"
            f"  {seats}  queue {len(report.waiting)}  blocks {used_blocks}/{kv.num_blocks}"
            f"  useful {kv.useful_frac:.0%}{extra}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.generate", description=__doc__.split("\n")[0])
    ap.add_argument("prompt", nargs="+", help="one or more prompts (each runs as a request)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None, help="the requests' seed")
    ap.add_argument("--chat", action="store_true", help="apply the model's chat template")
    ap.add_argument("--trace", action="store_true", help="print one line per engine step")
    ap.add_argument("--spec", dest="spec_mode", default=None, choices=SPEC_MODES,
                    help="speculative decoding's method, drafting --k tokens a step "
                         "(default: off; --speculative-config says more)")
    ap.add_argument("--k", type=int, default=SpecConfig().num_speculative_tokens,
                    help="tokens drafted per step, with --spec")
    EngineConfig.add_cli_args(ap, skip=("seed",))  # --seed is the requests' (above)
    return ap


def config_of(args: argparse.Namespace) -> EngineConfig:
    """The engine's configuration from the flags; ValueError naming a field it refuses."""
    config = EngineConfig.from_args(args)
    if args.spec_mode is not None:
        if hasattr(args, "spec"):
            raise ValueError("give --spec or --speculative-config, not both")
        spec = None if args.spec_mode == "off" else SpecConfig(args.spec_mode, args.k)
        config = dataclasses.replace(config, spec=spec)
    return config


def main(argv: list[str] | None = None) -> int:
    from engine.threads import spin_briefly

    spin_briefly()  # before torch loads: this process runs one engine (engine/threads.py)
    ap = build_parser()
    args = ap.parse_args(argv)
    try:  # a bad flag is refused before torch loads
        config = config_of(args)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))

    from engine.engine import LLMEngine

    try:
        engine = LLMEngine(config)
        rids = []
        for p in args.prompt:
            if args.chat:
                p = engine.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            rids.append(engine.add_request(p, params))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stream = len(rids) == 1 and not args.trace
    while engine.has_unfinished():
        report = engine.step()
        if args.trace:
            print(trace_line(report), flush=True)
        elif stream:
            for e in report.emitted:
                print(e.text, end="", flush=True)
    if stream:
        print()
    else:
        for rid in rids:
            out = engine.output(rid)
            print(f"--- {rid} ({out.finish_reason}, {len(out.token_ids)} tokens)\n{out.text}")
    snap = engine.metrics_snapshot()
    print(f"[{engine.describe()}; {snap['output_tokens']} tokens, "
          f"TTFT p50 {snap['ttft_p50_s'] * 1000:.0f} ms, TPOT p50 {snap['tpot_p50_s'] * 1000:.0f} ms]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
