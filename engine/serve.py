"""`python -m engine.serve`: one engine, many users, over OpenAI's HTTP API (FastAPI + uvicorn).

    python -m engine.serve                                   # 127.0.0.1:8000, continuous + paged
    python -m engine.serve --batching static --kv-layout contiguous --max-num-seqs 16
    python -m engine.serve --host 0.0.0.0                    # needs a key: prints a join code
    python -m engine.serve --engine-config '{"max_num_seqs": 16, "dtype": "bfloat16"}'

The engine's flags are `EngineConfig`'s fields (`EngineConfig.add_cli_args`: a flag per
field with vLLM's name where vLLM has one, `--max-num-seqs`, `--block-size`,
`--max-model-len`, `--enable-prefix-caching`, `--speculative-config` as JSON; ServeLab's
switches `--batching`, `--kv-layout`; the field's default and choices), and
`--engine-config JSON|PATH` gives them all at once (a benchmark serving any configuration:
`benchmarks/peer.py`). Beside them: `--host`, `--port`, `--api-key` and the server's limits
(`ServerSettings`, `engine/server/state.py`). One process runs one engine and one stepping
loop: two engines never step at once on the same cores.

Binding anything but a loopback address needs an API key (the class's join code): given
with `--api-key`, or generated and printed at start. With a join code the server is in class
mode: limits per phone and per address, `sim-*` users and long answers for the teacher's
admin key only (`engine/server/state.py` says who is asking and how it is counted). The
students' page and the votes are not here: `python -m classroom.serve` (the same flags) is
this server with the classroom's routers mounted (`main(routers=...)`). Slow clients are
cut (`--header-timeout`, `--body-timeout`); Ctrl-C drains for at most `--shutdown-timeout`
seconds (`engine/server/http.py`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import sys

from engine.config import EngineConfig, SpecConfig, spec_config  # noqa: F401 (re-exported)
from engine.server.http import HEADER_TIMEOUT_S, SHUTDOWN_TIMEOUT_S

CLASS_PER_CLIENT = 8  # class mode's default requests in flight per phone (or address)
CLASS_PER_ADDRESS = 32  # and per address: phones behind one router share it


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_parser(prog: str = "python -m engine.serve",
                 description: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n")[0])
    a = ap.add_argument
    a("--host", default="127.0.0.1", help="address to bind (non-loopback needs an API key)")
    a("--port", type=int, default=8000)
    a("--api-key", default=None, help="clients send 'Authorization: Bearer <key>'")
    a("--admin-key", default=os.environ.get("SERVELAB_ADMIN_KEY"),
      help="the teacher's key for the step stream and /metrics (default: $SERVELAB_ADMIN_KEY)")
    a("--served-model-name", default=None, help="the name clients put in `model` "
                                                "(default: the model)")
    # the engine's flags, defaults and choices are EngineConfig's own, the same as
    # `engine.generate`'s: 8 seats by default here too. A server for a load says how many
    # seats it wants (the class server passes --max-num-seqs 16, `classroom/client.py`; the
    # benches their --seats), so no serve-only default disagrees with the offline engine's
    EngineConfig.add_cli_args(ap)
    a("--max-queue", type=int, default=1024, help="requests in the server at once; then 429")
    a("--max-requests-per-user", type=int, default=None,
      help="per client, then 429 (default: no cap on loopback without a key, as vLLM; "
           f"{CLASS_PER_CLIENT} per phone or address in class mode)")
    a("--max-requests-per-address", type=int, default=None,
      help=f"class mode: per address, all its phones together (default {CLASS_PER_ADDRESS})")
    a("--student-max-tokens", type=int, default=256,
      help="class mode: the largest max_tokens the join code may ask (more: the admin key)")
    a("--forwarded-allow-ips", default=os.environ.get("FORWARDED_ALLOW_IPS", ""),
      help="comma-separated proxies whose X-Forwarded-For is believed (default: none)")
    a("--allowed-hosts", default="",
      help="comma-separated host names this server answers to besides its addresses and "
           "localhost (others get 421: DNS rebinding)")
    a("--header-timeout", type=float, default=HEADER_TIMEOUT_S,
      help="seconds a client has to send a request's headers; then the connection closes")
    a("--body-timeout", type=float, default=30.0,
      help="seconds a client has to send a request's body; then 408")
    a("--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT_S,
      help="Ctrl-C: seconds answers in progress may go on before they are cut")
    a("--max-tokens-cap", type=int, default=None, help="largest max_tokens (default: model len)")
    a("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    a("--no-step-stream", action="store_true",
      help="serve no step stream (as vLLM): the teacher's views read /metrics only")
    a("--record", default=None, metavar="PATH",
      help="record every step (with who asked) to PATH, a gzip JSONL recording the app replays")
    a("--trace", default=None, metavar="PATH",
      help="write the run as a trace (Perfetto's UI, chrome://tracing) to PATH on shutdown: "
           "a track per seat and per request, why each waited, KV and queue counters")
    a("--log-level", default="warning")
    return ap


def main(argv: list[str] | None = None, routers=(), parser=None) -> int:
    """Serve until Ctrl-C. `routers`: more routers for `create_app` to mount (the class
    server's, from `python -m classroom.serve`); `parser`: its own `build_parser(...)`."""
    from engine.threads import spin_briefly

    spin_briefly()  # before torch loads: this process serves one engine (engine/threads.py)
    ap = parser or build_parser()
    args = ap.parse_args(argv)
    for name in ("max_queue", "max_requests_per_user", "max_requests_per_address",
                 "max_body_bytes", "student_max_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_tokens_cap is not None and args.max_tokens_cap < 1:
        ap.error("--max-tokens-cap must be >= 1")
    try:
        config = EngineConfig.from_args(args)
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))
    api_key = args.api_key
    if not is_loopback(args.host) and not api_key:
        api_key = secrets.token_urlsafe(6)  # short enough to read off a projector
        print(f"binding {args.host}: clients need the join code (API key) {api_key}")

    from engine.engine import LLMEngine
    from engine.server import ServerSettings, create_app
    from engine.server.http import make_server
    from engine.threads import freeze_startup_heap

    try:
        engine = LLMEngine(config)
    except ValueError as exc:
        ap.error(str(exc))
    print(f"plan: {engine.plan.describe()}", flush=True)  # how every step runs (engine/plan.py)
    freeze_startup_heap()  # this process serves this one engine until it exits
    # a join code means a class: limits per phone and per address unless given; without one
    # (one person's own server on loopback) requests queue, as in vLLM
    per_client, per_address = args.max_requests_per_user, args.max_requests_per_address
    if api_key is not None:
        per_client = per_client or CLASS_PER_CLIENT
        per_address = per_address or CLASS_PER_ADDRESS
    settings = ServerSettings(
        model_name=args.served_model_name or config.model, api_key=api_key,
        max_queue=args.max_queue, max_requests_per_user=per_client,
        max_requests_per_address=per_address, student_max_tokens=args.student_max_tokens,
        max_tokens_cap=args.max_tokens_cap, max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout, admin_key=args.admin_key,
        forwarded_allow_ips=_names(args.forwarded_allow_ips),
        allowed_hosts=_names(args.allowed_hosts), bind_host=args.host,
        step_stream=not args.no_step_stream)
    app = create_app(engine, settings, routers=routers)
    recorder = None
    if args.record:
        from engine.recording import Recorder, machine_facts

        recorder = Recorder(args.record, config, machine_facts(str(engine.device)),
                            source="class-server")
        app.state.loop.recorder = recorder
    tracer = None
    if args.trace:
        from engine.trace import TraceWriter

        tracer = app.state.loop.tracer = TraceWriter(args.trace)
    print(f"[{engine.describe()}] {config.batching} batching, {config.kv_layout} KV, "
          f"{config.max_num_seqs} seats; serving {settings.model_name!r} on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    try:
        make_server(app, args.host, args.port, args.log_level,
                    header_timeout_s=args.header_timeout,
                    shutdown_timeout_s=args.shutdown_timeout).run()
    finally:
        if recorder is not None:  # after the loop stopped: no step writes while it closes
            recorder.close()
            print(f"recorded {recorder.steps[0]} steps to {args.record}", flush=True)
        if tracer is not None:
            tracer.close()
            print(f"wrote the trace of {tracer.builder.steps} steps to {args.trace}", flush=True)
    return 0


def _names(text: str) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


if __name__ == "__main__":
    sys.exit(main())
