"""Command line: `python -m engine.generate "prompt" [--max-tokens N] [--temperature T] [--trace]`.

Streams the answer as the engine steps. `--trace` prints one compact line per step instead
(who sits in which seat, what each computed, blocks used): the text version of the app.
"""

from __future__ import annotations

import argparse
import sys

from engine.config import EngineConfig, SamplingParams, SpecConfig


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


def main(argv: list[str] | None = None) -> int:
    from engine.threads import spin_briefly

    spin_briefly()  # before torch loads: this process runs one engine (engine/threads.py)
    ap = argparse.ArgumentParser(prog="python -m engine.generate", description=__doc__.split("\n")[0])
    ap.add_argument("prompt", nargs="+", help="one or more prompts (each runs as a request)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--chat", action="store_true", help="apply the model's chat template")
    ap.add_argument("--trace", action="store_true", help="print one line per engine step")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batching", default="continuous", choices=["static", "continuous"])
    ap.add_argument("--kv-layout", default="paged", choices=["contiguous", "paged"])
    ap.add_argument("--spec", default="off", choices=["off", "ngram", "draft"])
    ap.add_argument("--k", type=int, default=4, help="tokens drafted per step")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args(argv)

    from engine.engine import LLMEngine

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed)
        spec = None if args.spec == "off" else SpecConfig(args.spec, args.k)
        cfg = EngineConfig(model=args.model, batching=args.batching, kv_layout=args.kv_layout,
                           spec=spec, max_num_seqs=args.max_num_seqs,
                           max_model_len=args.max_model_len, dtype=args.dtype)
        engine = LLMEngine(cfg)
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
