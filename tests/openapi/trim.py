"""Make `openai-trimmed.json` from OpenAI's published spec (openai/openai-openapi, MIT, the
LICENSE file here): `python tests/openapi/trim.py path/to/openapi.json`.

Kept: `POST /completions`, `POST /chat/completions`, `GET /models` and every schema they
reach. Changed, so the conformance test talks to this server and stays short:
  * `model` may only be the served name (OpenAI's lists other models);
  * `max_tokens` / `max_completion_tokens` at most 4 and `n` at most 3 (each request
    stays a few engine steps; the server refuses larger values with a 400 anyway);
  * a completion's `logprobs.token_logprobs` and `top_logprobs` items may be null: with
    `echo`, the prompt's first token has no logprob (nothing predicts it), and OpenAI's
    API and vLLM answer null there, though the spec's items say "number" / "object".
Nothing else is changed: every other field, type and range is OpenAI's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODEL = "smollm2-135m"
PATHS = {"/completions": ["post"], "/chat/completions": ["post"], "/models": ["get"]}
CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 3}


def refs(node, found: set[str]) -> None:
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/components/"):
            found.add(r)
        for v in node.values():
            refs(v, found)
    elif isinstance(node, list):
        for v in node:
            refs(v, found)


def lookup(spec: dict, ref: str):
    node = spec
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def cap(props: dict) -> None:
    for name, limit in CAPS.items():
        p = props.get(name)
        if p is None:
            continue
        for variant in [p, *p.get("anyOf", [])]:
            if variant.get("type") == "integer":
                variant["maximum"] = limit


def main(src: str) -> None:
    spec = json.loads(Path(src).read_text())
    out = {k: spec[k] for k in ("openapi", "info") if k in spec}
    out["servers"] = [{"url": "/v1"}]
    out["paths"] = {p: {m: spec["paths"][p][m] for m in ms} for p, ms in PATHS.items()}
    found: set[str] = set()
    refs(out["paths"], found)
    done: set[str] = set()
    while found - done:
        r = sorted(found - done)[0]
        done.add(r)
        refs(lookup(spec, r), found)
    comps: dict = {}
    for r in sorted(done):
        _, _, kind, name = r.split("/")
        comps.setdefault(kind, {})[name] = lookup(spec, r)
    out["components"] = comps
    schemas = comps["schemas"]
    model = {"type": "string", "enum": [MODEL]}
    schemas["CreateCompletionRequest"]["properties"]["model"] = model
    cap(schemas["CreateCompletionRequest"]["properties"])
    choice = schemas["CreateCompletionResponse"]["properties"]["choices"]["items"]
    for variant in choice["properties"]["logprobs"]["anyOf"]:
        for name in ("token_logprobs", "top_logprobs"):
            if name in variant.get("properties", {}):
                items = variant["properties"][name]["items"]
                variant["properties"][name]["items"] = {"anyOf": [items, {"type": "null"}]}
    for part in schemas["CreateChatCompletionRequest"]["allOf"]:
        if "properties" in part and "messages" in part["properties"]:
            part["properties"]["model"] = model
            cap(part["properties"])
    Path(__file__).with_name("openai-trimmed.json").write_text(
        json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
