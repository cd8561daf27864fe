"""`python -m engine.serve`: one engine, many users, over OpenAI's HTTP API (FastAPI + uvicorn).

    python -m engine.serve                                   # 127.0.0.1:8000, continuous + paged
    python -m engine.serve --batching static --kv-layout contiguous --max-num-seqs 16
    python -m engine.serve --host 0.0.0.0                    # the class joins: prints a join code

Flags carry vLLM's names where vLLM has one (`--max-num-seqs`, `--block-size`,
`--max-model-len`, `--enable-prefix-caching`, `--speculative-config` as JSON, `--host`,
`--port`, `--api-key`), plus ServeLab's switches (`--batching`, `--kv-layout`,
`--num-kv-blocks`) and the server's limits (`ServerSettings`, `engine/server/state.py`). One
process runs one engine and one stepping loop: two engines never step at once on the same
cores.

Binding anything but a loopback address needs an API key (the class's join code): given
with `--api-key`, or generated and printed at start.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import sys

from engine.config import WEIGHTS, EngineConfig, SpecConfig


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def spec_config(text: str | None) -> SpecConfig | None:
    """vLLM's --speculative-config JSON: {"method": "ngram" | "draft" | "eagle",
    "num_speculative_tokens": k, "model": <draft model>, "prompt_lookup_min/max": n}, plus
    ServeLab's "adaptive_k": true (choose k each step), "min_confidence" and
    "prompt_lookup_first": true (a draft or eagle model behind prompt lookup)."""
    if not text:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config is not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("--speculative-config must be a JSON object")
    known = {"method", "num_speculative_tokens", "model", "prompt_lookup_min",
             "prompt_lookup_max", "adaptive_k", "min_confidence", "prompt_lookup_first"}
    if unknown := set(obj) - known:
        raise ValueError(f"--speculative-config: unknown keys {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    if "model" in obj:
        obj["draft_model"] = obj.pop("model")
    return SpecConfig(**obj)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.serve",
                                 description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--host", default="127.0.0.1", help="address to bind (non-loopback needs an API key)")
    a("--port", type=int, default=8000)
    a("--api-key", default=None, help="clients send 'Authorization: Bearer <key>'")
    a("--admin-key", default=os.environ.get("SERVELAB_ADMIN_KEY"),
      help="the teacher's key for the step stream and /metrics (default: $SERVELAB_ADMIN_KEY)")
    a("--model", default="smollm2-135m", help="bundled model name or local HF folder")
    a("--served-model-name", default=None, help="the name clients put in `model`")
    a("--batching", default="continuous", choices=["continuous", "static"])
    a("--kv-layout", default="paged", choices=["paged", "contiguous"])
    a("--max-num-seqs", type=int, default=16, help="seats")
    a("--block-size", type=int, default=16)
    a("--num-kv-blocks", type=int, default=None)
    a("--max-model-len", type=int, default=512)
    a("--max-num-batched-tokens", type=int, default=512)
    a("--enable-prefix-caching", action="store_true")
    a("--speculative-config", default=None, help='JSON, e.g. {"method": "ngram", '
                                                 '"num_speculative_tokens": 4}')
    a("--dtype", default="auto")
    a("--weights", default="auto", choices=WEIGHTS,
      help="dense tensors, the GGUF file's own blocks, or those with int8 or int16 "
           "activations (gguf-q8, gguf-q16)")
    a("--device", default="auto")
    a("--seed", type=int, default=0)
    a("--max-queue", type=int, default=1024, help="requests in the server at once; then 429")
    a("--max-requests-per-user", type=int, default=8, help="per client; then 429")
    a("--max-tokens-cap", type=int, default=None, help="largest max_tokens (default: model len)")
    a("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    a("--no-step-stream", action="store_true",
      help="serve no step stream (as vLLM): the teacher's views read /metrics only")
    a("--record", default=None, metavar="PATH",
      help="record every step (with who asked) to PATH, a gzip JSONL recording the app replays")
    a("--log-level", default="warning")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    for name in ("max_queue", "max_requests_per_user", "max_body_bytes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_tokens_cap is not None and args.max_tokens_cap < 1:
        ap.error("--max-tokens-cap must be >= 1")
    try:
        config = EngineConfig(
            model=args.model, batching=args.batching, kv_layout=args.kv_layout,
            spec=spec_config(args.speculative_config), max_num_seqs=args.max_num_seqs,
            block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
            max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=args.enable_prefix_caching, device=args.device,
            dtype=args.dtype, weights=args.weights, seed=args.seed)
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))
    api_key = args.api_key
    if not is_loopback(args.host) and not api_key:
        api_key = secrets.token_urlsafe(6)  # short enough to read off a projector
        print(f"binding {args.host}: clients need the join code (API key) {api_key}")

    import uvicorn

    from engine.engine import LLMEngine, freeze_startup_heap
    from engine.server import ServerSettings, create_app

    try:
        engine = LLMEngine(config)
    except ValueError as exc:
        ap.error(str(exc))
    freeze_startup_heap()  # this process serves this one engine until it exits
    settings = ServerSettings(
        model_name=args.served_model_name or args.model, api_key=api_key,
        max_queue=args.max_queue, max_requests_per_user=args.max_requests_per_user,
        max_tokens_cap=args.max_tokens_cap, max_body_bytes=args.max_body_bytes,
        admin_key=args.admin_key, step_stream=not args.no_step_stream)
    app = create_app(engine, settings)
    recorder = None
    if args.record:
        from engine.recording import Recorder, machine_facts

        recorder = Recorder(args.record, config, machine_facts(str(engine.device)),
                            source="class-server")
        app.state.loop.recorder = recorder
    print(f"[{engine.describe()}] {config.batching} batching, {config.kv_layout} KV, "
          f"{config.max_num_seqs} seats; serving {settings.model_name!r} on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if recorder is not None:  # after the loop stopped: no step writes while it closes
            recorder.close()
            print(f"recorded {recorder.steps[0]} steps to {args.record}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
