"""`python -m benchmarks.serve_config CONFIG_JSON --port N`: `engine.serve` for any EngineConfig.

`python -m engine.serve` has a flag for each switch a class flips. A benchmark that puts the
engine beside another server (`benchmarks/peer.py`) wants every `EngineConfig` field, a new
one too (a weights format, a kernel choice), without a flag for each: this takes the
configuration as one JSON object, `{"max_num_seqs": 16, "dtype": "bfloat16", ...}`, and serves
it on 127.0.0.1 with the same app and HTTP server as `engine.serve` (`engine.server.create_app`,
`engine.server.http.make_server`). A field `EngineConfig` does not know is refused with its name.
"""

from __future__ import annotations

import argparse
import json
import sys

from engine.config import EngineConfig, SpecConfig


def config_from_json(text: str) -> EngineConfig:
    """An EngineConfig from a JSON object; ValueError naming what was wrong."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"engine config is not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("engine config must be a JSON object of EngineConfig fields")
    known = set(EngineConfig.__dataclass_fields__)
    if unknown := sorted(set(obj) - known):
        raise ValueError(f"EngineConfig has no field {', '.join(map(repr, unknown))} "
                         f"(this checkout's fields: {', '.join(sorted(known))})")
    if isinstance(obj.get("spec"), dict):
        obj["spec"] = SpecConfig(**obj["spec"])
    return EngineConfig(**obj)


def main(argv: list[str] | None = None) -> int:
    from engine.threads import spin_briefly

    spin_briefly()  # before torch loads: this process serves one engine (engine/threads.py)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_config",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("config", help="EngineConfig fields as a JSON object")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name", default="smollm2-135m")
    args = ap.parse_args(argv)
    try:
        config = config_from_json(args.config)
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))

    from engine.engine import LLMEngine, freeze_startup_heap
    from engine.server import ServerSettings, create_app
    from engine.server.http import make_server

    engine = LLMEngine(config)
    app = create_app(engine, ServerSettings(model_name=args.served_model_name))
    freeze_startup_heap()  # as engine.serve does
    print(f"[{engine.describe()}] serving on http://127.0.0.1:{args.port}/v1", flush=True)
    make_server(app, "127.0.0.1", args.port).run()  # the HTTP server engine.serve runs
    return 0


if __name__ == "__main__":
    sys.exit(main())
