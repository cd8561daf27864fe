"""OutputProcessor (engine/server/outputs.py): a StepReport and the tickets -> each ticket's
deltas, finishes, per-request failures and aborts. Hand-made reports check each rule alone;
the last test feeds it a real engine's reports."""

from __future__ import annotations

import pytest

from engine.config import SamplingParams
from engine.report import Emitted, KVSummary, StepReport
from engine.server.metrics import ServerMetrics
from engine.server.outputs import OutputProcessor, Ticket, TokenText


def _report(step=1, emitted=(), finished=(), aborted=(), failures=None) -> StepReport:
    kv = KVSummary(block_size=16, num_blocks=4, layout="paged", blocks=[], block_tables={},
                   used_slots=0, allocated_slots=0, internal_waste_slots=0, free_slots=64,
                   total_slots=64, free_blocks=4, largest_free_run=4, useful_frac=1.0,
                   external_frag=0.0)
    return StepReport(step=step, wall_s=0.01, switches={}, num_batched_tokens=0, seats=[],
                      waiting=[], admitted=[], finished=list(finished), preempted=[],
                      blocked_reason=None, emitted=list(emitted), kv=kv, aborted=list(aborted),
                      failures=dict(failures or {}))


def _ticket(rid: str, n: int = 1, arrival: float = 0.0, **params) -> Ticket:
    t = Ticket(rid, SamplingParams(n=n, **params), "alice", aloop=None, queue=None,
               arrival=arrival)
    t.open_samples = n
    return t


@pytest.fixture
def proc(tokenizer):
    return OutputProcessor(TokenText(tokenizer), ServerMetrics("m"))


def _metric(proc, name, **labels):
    return proc.metrics.registry.get_sample_value(name, {"model_name": "m", **labels}) or 0.0


def test_tokens_and_text_become_one_delta_per_ticket_and_sample(proc):
    tickets = {"a": _ticket("a"), "g": _ticket("g", n=2)}
    proc.add(tickets["a"], ["a"], [1, 2])
    proc.add(tickets["g"], ["g#0", "g#1"], [1, 2])
    out = proc.process(_report(3, [Emitted("a", [5], "Hi"), Emitted("g#1", [7, 8], " there"),
                                   Emitted("g#0", [9], "!")]), tickets, now=2.0)
    assert set(out.deltas) == {("a", 0), ("g", 1), ("g", 0)}
    d = out.deltas[("g", 1)]
    assert (d.token_ids, d.text, d.index, d.step, d.finish_reason) == ([7, 8], " there", 1, 3,
                                                                        None)
    assert out.deltas[("a", 0)].text == "Hi" and not out.finishing and not out.done
    assert [(t.request_id, d.index) for t, d in out.pairs(tickets)] == [("a", 0), ("g", 1),
                                                                        ("g", 0)]
    assert tickets["g"].num_output_tokens == 3 and tickets["g"].first_token_time == 2.0
    assert _metric(proc, "vllm:generation_tokens_total") == 4
    assert _metric(proc, "vllm:time_to_first_token_seconds_count") == 2  # a and g, once each


def test_a_ticket_finishes_when_its_last_sample_does(proc):
    tickets = {"g": _ticket("g", n=2, arrival=1.0)}
    proc.add(tickets["g"], ["g#0", "g#1"], [1])
    out = proc.process(_report(1, [Emitted("g#0", [4], "x", finish_reason="length")],
                               finished=["g#0"]), tickets, now=2.0)
    assert out.deltas[("g", 0)].finish_reason == "length"
    assert "g" in tickets and not out.finishing and not out.done  # sample 1 still runs
    out = proc.process(_report(2, [Emitted("g#1", [6], "y", finish_reason="eos")],
                               finished=["g#1"]), tickets, now=5.0)
    assert out.deltas[("g", 1)].finish_reason == "eos"
    assert "g" not in tickets and list(out.finishing) == ["g"] and out.done == ["g"]
    assert [d.index for _, d in out.pairs(tickets)] == [1]  # a finishing ticket still gets it
    assert _metric(proc, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(4.0)
    assert _metric(proc, "vllm:request_success_total", finished_reason="stop") == 1
    assert proc.owner("g#1") == ("g", 1)  # forgotten: from its name now


def test_prompt_and_output_logprobs_become_token_infos(proc, tokenizer):
    tickets = {"p": _ticket("p", logprobs=1, prompt_logprobs=1)}
    prompt = tokenizer.encode("Hello world", add_special_tokens=False)
    proc.add(tickets["p"], ["p"], prompt)
    out = proc.process(_report(1, [Emitted(
        "p", [prompt[0]], "x", logprobs=[(-0.5, [(prompt[0], -0.5)])],
        prompt_logprobs=[None, (-2.0, [(7, -1.0)])])]), tickets)
    d = out.deltas[("p", 0)]
    (info,) = d.logprobs
    assert info["id"] == prompt[0] and info["logprob"] == -0.5
    assert info["token"] == tokenizer.decode([prompt[0]]) and info["top"][0]["id"] == prompt[0]
    first, second = d.prompt_logprobs
    assert first["logprob"] is None and first["top"] is None and first["id"] == prompt[0]
    assert second["id"] == prompt[1] and second["logprob"] == -2.0
    assert second["top"] == [{"id": 7, "token": TokenText(tokenizer)(7)[0],
                              "bytes": TokenText(tokenizer)(7)[1], "logprob": -1.0}]


def test_a_failure_fails_its_ticket_alone_and_an_abort_leaves_quietly(proc):
    tickets = {r: _ticket(r) for r in ("ok", "bad", "gone")}
    for r, t in tickets.items():
        proc.add(t, [r], [1])
    out = proc.process(_report(4, [Emitted("ok", [3], "fine"), Emitted("bad", [3], "no")],
                               aborted=["bad", "gone"],
                               failures={"bad": "RuntimeError: nan"}), tickets)
    (t, d), = out.errors
    assert t.request_id == "bad" and d.error.status == 500 and d.error.code == "request_failed"
    assert "RuntimeError: nan" in d.error.message
    assert list(tickets) == ["ok"] and out.done == ["bad", "gone"]
    assert out.aborted == ["bad", "gone"]
    assert [t.request_id for t, _ in out.pairs(tickets)] == ["ok"]  # nothing more for those


def test_a_finish_without_a_ticket_is_only_forgotten(proc):
    out = proc.process(_report(1, [Emitted("x", [1], "a", finish_reason="length")],
                               finished=["x"]), {})
    assert out.done == ["x"] and not out.deltas and not out.finishing


@pytest.mark.slow
def test_a_real_engines_reports_rebuild_its_outputs(engine, tokenizer):
    """Deltas added up are the engine's own output; an EOS that ends an answer keeps its id
    but not its text (the detokenizer leaves it out)."""
    eos = tokenizer.eos_token_id
    proc = OutputProcessor(TokenText(tokenizer))
    params = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=8, min_tokens=2, logit_bias={eos: 100.0}),
              SamplingParams(max_tokens=5, temperature=0.8, seed=3, n=2, ignore_eos=True)]
    tickets = {}
    for i, sp in enumerate(params):
        rid = f"t{i}"
        ids = engine.tokenize("The capital of France is")
        engine.add_request(ids, sp, request_id=rid)
        tickets[rid] = _ticket(rid, n=sp.n)
        proc.add(tickets[rid], engine.sample_ids(rid), ids)
    got: dict[tuple[str, int], list] = {}
    open_tickets = dict(tickets)
    while engine.has_unfinished():
        out = proc.process(engine.step(), open_tickets)
        for t, d in out.pairs(open_tickets):
            tok, text, fin = got.setdefault((t.request_id, d.index), [[], "", None])
            got[(t.request_id, d.index)] = [tok + d.token_ids, text + d.text,
                                            d.finish_reason or fin]
        for rid in out.done:
            engine.forget(rid)
    assert not open_tickets and not engine.requests
    want = {("t0", 0): 6, ("t1", 0): 3, ("t2", 0): 5, ("t2", 1): 5}
    assert {k: len(v[0]) for k, v in got.items()} == want
    for key, (toks, text, fin) in got.items():
        assert fin == ("eos" if key[0] == "t1" else "length")
        whole = tokenizer.decode(toks[:-1] if fin == "eos" else toks)
        # sampled ones may end inside a character, which the text holds back
        assert text == whole if key[0] != "t2" else whole.startswith(text), key
    toks, text, _ = got[("t1", 0)]
    assert toks[-1] == eos and tokenizer.decode([eos]) not in text
