"""The teacher's switch flip inside the running server: the class keeps its address.

Routes (under `/v1/servelab/`, so the teacher's admin key guards them):
- `POST /v1/servelab/engine` with `{"changes": {<EngineConfig field>: value, ...},
  "abort": false, "drain_s": 60}`: build an engine with the current configuration changed
  by `changes`, each field as `dataclasses.asdict` gives it (`spec` a plain object of
  `SpecConfig` fields, vLLM's `--speculative-config` `model` accepted for `draft_model`, or
  null for off; the same shape the GET reads back), and swap it
  in (`EngineLoop.swap`: drain up to `drain_s` seconds, or cut the answers in flight with
  `abort`). 202 at once with the status; a bad change is a 400 naming the field, a second
  flip while one runs a 409.
- `GET /v1/servelab/engine`: the swap's status (`phase`: serving, draining with
  `seconds_left`, building, failed with `error`; `generation` counts the engines built) and
  the engine's configuration now.
"""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from engine.config import EngineConfig, SpecConfig
from engine.server.protocol import APIError
from engine.server.state import ServerState

# what a flip may change: the switches and the sizes a class needs; never the model,
# the device or the weights (those are the server's own, set when it started)
CHANGEABLE = ("batching", "kv_layout", "spec", "max_num_seqs", "num_kv_blocks",
              "enable_prefix_caching", "max_num_batched_tokens")
MAX_DRAIN_S = 600.0


class SwitchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    changes: dict = Field(default_factory=dict)
    abort: bool = False
    drain_s: float = 60.0


def new_config(current: EngineConfig, changes: dict) -> EngineConfig:
    """`current` with `changes` applied, validated as the engine validates its own: the
    changed fields as they are (`dataclasses.replace`), `spec` a plain object that
    `SpecConfig` validates (no JSON text on the way)."""
    if unknown := set(changes) - set(CHANGEABLE):
        raise APIError(400, f"cannot change {sorted(unknown)} while serving; the switches "
                            f"are {list(CHANGEABLE)}", param="changes")
    changes = dict(changes)
    if changes.get("spec") is not None:
        try:
            changes["spec"] = SpecConfig.from_dict(changes["spec"])
        except (ValueError, TypeError) as exc:
            raise APIError(400, f"spec: {exc}", param="changes.spec") from None
    try:
        return dataclasses.replace(current, **changes)
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"bad switch: {exc}", param="changes") from None


def router(state: ServerState) -> APIRouter:
    r = APIRouter()
    loop = state.loop

    def status() -> dict:
        return {"status": loop.swap_status,
                "config": dataclasses.asdict(loop.engine.config)}

    @r.get("/v1/servelab/engine")
    async def engine_status():
        return status()

    @r.post("/v1/servelab/engine", status_code=202)
    async def switch(body: SwitchBody):
        if not 0 <= body.drain_s <= MAX_DRAIN_S:
            raise APIError(400, f"drain_s must be 0 to {MAX_DRAIN_S:g} seconds",
                           param="drain_s")
        config = new_config(loop.engine.config, body.changes)
        loop.swap(config, abort=body.abort, drain_s=body.drain_s)
        return status()

    return r
