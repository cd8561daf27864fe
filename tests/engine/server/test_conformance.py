"""Conformance: schemathesis generates requests from OpenAI's own OpenAPI spec (a trimmed copy,
tests/openapi/: completions, chat completions, models; `model` fixed to the served name,
max_tokens and n kept small; trim.py says exactly what changed) and sends them to a real
server. Every answer must be no 5xx, and every 2xx body must match OpenAI's response schema.
Whatever a generated request holds (refused fields, odd messages, nulls, every type of
prompt), the server answers it or refuses it by name; it never breaks.

Two passes: the spec as it is (nearly every generated request sets some field the server
refuses, so most answers are 400s), then the same spec without the fields the server
refuses (`protocol._REFUSED`), whose requests are mostly answered: their bodies are what
the response schemas check."""

from __future__ import annotations

import collections
import copy
import json
import time
from pathlib import Path

import pytest

from engine.server import ServerSettings
from tests.conftest import running_server

pytestmark = pytest.mark.slow

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openai-trimmed.json"
# examples per operation and pass: make test's run, and make test-soak's full one
SMALL = {"POST /completions": 40, "POST /chat/completions": 40, "GET /models": 5}
FULL = {"POST /completions": 130, "POST /chat/completions": 130, "GET /models": 5}


def without_refused(spec: dict) -> dict:
    """The spec less the request fields the server refuses whatever their value, and with
    no fields beyond the spec's (which it would generate, and the server refuses)."""
    from engine.server.protocol import _REFUSED

    spec = copy.deepcopy(spec)
    schemas = spec["components"]["schemas"]
    drop = set(_REFUSED) | {"best_of"}
    parts = [part for name, sch in schemas.items()
             if name.startswith("Create") and name.endswith("Request")
             or name.endswith("ResponseProperties")
             for part in (sch, *sch.get("allOf", ()))]
    # no fields beyond the spec's: only where one schema holds them all (allOf parts cannot
    # each forbid the others' fields)
    schemas["CreateCompletionRequest"]["additionalProperties"] = False
    for part in parts:
        for name in drop & set(part.get("properties", {})):
            del part["properties"][name]
            if name in part.get("required", []):
                part["required"].remove(name)
    return spec
TIME_LIMIT_S = 300  # the whole run; each request is at most a few engine steps


@pytest.mark.parametrize("examples,least,least_ok", [
    (SMALL, 150, 10), pytest.param(FULL, 500, 25, marks=pytest.mark.soak)],
    ids=["small", "full"])
def test_openai_spec_conformance(engine, examples, least, least_ok):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error, response_schema_conformance

    statuses: collections.Counter = collections.Counter()
    failures: list[str] = []
    refusals: collections.Counter = collections.Counter()  # 400s by the field they name
    # max_tokens_cap 4: a chat request without max_tokens stays short too
    with running_server(engine, ServerSettings(max_tokens_cap=4)) as (url, app):
        full = json.loads(SPEC.read_text())
        deadline = time.monotonic() + TIME_LIMIT_S
        ops = [r.ok() for spec in (full, without_refused(full))
               for r in schemathesis.openapi.from_dict(spec).get_all_operations()]
        for op in ops:

            @given(case=op.as_strategy())
            @settings(max_examples=examples[op.label], deadline=None, database=None,
                      phases=[Phase.generate], derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def check(case):
                if time.monotonic() > deadline:
                    return
                response = case.call(base_url=f"{url}/v1", timeout=60)
                statuses[(op.label, response.status_code)] += 1  # noqa: B023 (called in this iteration)
                if response.status_code == 400:
                    refusals[response.json()["error"]["param"]] += 1
                try:
                    case.validate_response(response, checks=[not_a_server_error,
                                                             response_schema_conformance])
                except Exception as exc:  # keep going: report every kind of failure
                    failures.append(f"{op.label} {response.status_code}: "  # noqa: B023
                                    f"{str(exc)[:600]}\n  body: {str(case.body)[:300]}")

            check()
        held = app.state.loop.call(
            lambda e: e.allocator.num_blocks - e.allocator.num_free_blocks).result(30)
    total = sum(statuses.values())
    ok = sum(n for (_, s), n in statuses.items() if 200 <= s < 300)
    assert not failures, f"{len(failures)} failures of {total}:\n" + "\n".join(failures[:10])
    assert total >= least, f"only {total} requests in the time limit: {dict(statuses)}"
    assert not any(s >= 500 for _, s in statuses), dict(statuses)
    assert ok >= least_ok, (
        f"too few answered requests to check their schema: {dict(statuses)}; the 400s named "
        f"{refusals.most_common(12)}")
    assert held == 0  # every request's blocks came back
