"""Workload presets, JSONL loading and arrival processes (no model needed)."""

from __future__ import annotations

import json

import pytest

from benchmarks.workloads import (
    WORKLOAD_NAMES,
    WorkItem,
    Workload,
    get_workload,
    load_jsonl,
    with_arrivals,
)


def test_every_preset_exists_and_is_deterministic():
    assert set(WORKLOAD_NAMES) == {"longtail", "uniform", "shared-prefix", "grounded", "open",
                                   "chat"}
    for name in WORKLOAD_NAMES:
        a, b = get_workload(name), get_workload(name)
        assert a == b, f"{name} is not deterministic"
        assert a.name == name and a.description_en and a.description_zh
        assert len(a) >= 8
        assert len({it.name for it in a}) == len(a), f"{name}: item names repeat"
        for it in a:
            # only chat's answers end at EOS: its point is a reservation never written
            assert isinstance(it, WorkItem) and it.ignore_eos == (name != "chat")
            assert it.arrival_s == 0.0
            assert it.max_tokens >= 1
            assert it.prompt.startswith("<|im_start|>") and it.prompt.endswith(
                "<|im_start|>assistant\n"), f"{it.name}: no chat markup"


def test_longtail_is_long_tailed():
    w = get_workload("longtail")
    assert len(w) == 32
    short = [m for m in w.max_tokens if 8 <= m <= 32]
    long = [m for m in w.max_tokens if 128 <= m <= 200]
    assert len(short) + len(long) == 32
    assert 1 <= len(long) <= 6 and len(short) >= 24
    assert any("\u4e00" <= ch <= "\u9fff" for p in w.prompts for ch in p), "no Chinese prompt"
    assert any("```" in p for p in w.prompts), "no code prompt"
    assert get_workload("longtail", seed=1).max_tokens != w.max_tokens
    big = get_workload("longtail", n=200, seed=3)
    assert sum(m >= 128 for m in big.max_tokens) == 25  # one in eight, at any n


def test_other_presets_shapes():
    assert set(get_workload("uniform").max_tokens) == {64}
    shared = get_workload("shared-prefix")
    prefix = shared.prompts[0].split("<|im_start|>user")[0]
    assert len(prefix) > 800 and all(p.startswith(prefix) for p in shared.prompts)
    assert len(set(shared.prompts)) == len(shared)
    assert all(64 <= m <= 128 for m in get_workload("grounded").max_tokens)
    assert all(m >= 64 for m in get_workload("open").max_tokens)


def test_everything_fits_the_default_max_model_len():
    from transformers import AutoTokenizer

    from engine.model.loader import hf_folder

    tok = AutoTokenizer.from_pretrained(hf_folder("smollm2-135m"))
    for name in WORKLOAD_NAMES:
        for it in get_workload(name):
            n = len(tok(it.prompt).input_ids)
            assert n + it.max_tokens <= 512, f"{it.name}: {n} prompt + {it.max_tokens} output"
    shared = get_workload("shared-prefix").prompts[0]
    assert len(tok(shared.split("<|im_start|>user")[0]).input_ids) >= 200


def test_n_truncates_or_cycles_and_scale():
    full = get_workload("grounded")
    assert get_workload("grounded", n=3).items == full.items[:3]
    many = get_workload("grounded", n=len(full) + 5)
    assert len(many) == len(full) + 5
    assert many.prompts[len(full)] == full.prompts[0]
    assert len({it.name for it in many}) == len(many)
    scaled = get_workload("uniform", max_tokens_scale=0.5)
    assert set(scaled.max_tokens) == {32}
    assert min(get_workload("longtail", max_tokens_scale=0.01).max_tokens) == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="longtail.*uniform.*shared-prefix"):
        get_workload("nope")
    with pytest.raises(ValueError, match="n must be"):
        get_workload("uniform", n=0)
    with pytest.raises(ValueError, match="max_tokens_scale"):
        get_workload("uniform", max_tokens_scale=0)


def _write(tmp_path, lines):
    p = tmp_path / "mine.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_load_jsonl(tmp_path):
    p = _write(tmp_path, [
        json.dumps({"prompt": "hello", "max_tokens": 5}),
        "",
        json.dumps({"prompt": "你好", "max_tokens": 7, "ignore_eos": False, "arrival_s": 1.5,
                    "name": "greeting", "extra": "ignored"}),
    ])
    w = load_jsonl(p)
    assert isinstance(w, Workload) and w.name == "mine"
    assert w.items == [
        WorkItem("hello", 5, True, 0.0, "mine-00"),
        WorkItem("你好", 7, False, 1.5, "greeting"),
    ]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "a", "max_tokens": 3', r"line 2: not valid JSON"),
    ('["a", 3]', r"line 2: expected a JSON object"),
    ('{"max_tokens": 3}', r"line 2: field 'prompt'"),
    ('{"prompt": "", "max_tokens": 3}', r"line 2: field 'prompt'"),
    ('{"prompt": "a"}', r"line 2: field 'max_tokens'"),
    ('{"prompt": "a", "max_tokens": 0}', r"line 2: field 'max_tokens'"),
    ('{"prompt": "a", "max_tokens": 2.5}', r"line 2: field 'max_tokens'"),
    ('{"prompt": "a", "max_tokens": true}', r"line 2: field 'max_tokens'"),
    ('{"prompt": "a", "max_tokens": 3, "ignore_eos": "yes"}', r"line 2: field 'ignore_eos'"),
    ('{"prompt": "a", "max_tokens": 3, "arrival_s": -1}', r"line 2: field 'arrival_s'"),
])
def test_load_jsonl_errors_name_line_and_field(tmp_path, line, message):
    p = _write(tmp_path, [json.dumps({"prompt": "ok", "max_tokens": 1}), line])
    with pytest.raises(ValueError, match=message):
        load_jsonl(p)


def test_load_jsonl_empty(tmp_path):
    p = _write(tmp_path, ["", "  "])
    with pytest.raises(ValueError, match="no requests"):
        load_jsonl(p)


def test_arrivals():
    w = get_workload("longtail", n=2000)
    assert all(it.arrival_s == 0.0 for it in with_arrivals(w).items)
    rate = 4.0
    p = with_arrivals(w, "poisson", rate=rate, seed=7)
    t = [it.arrival_s for it in p.items]
    assert t[0] == 0.0
    assert all(b > a for a, b in zip(t, t[1:])), "arrivals must increase"
    mean_gap = t[-1] / (len(t) - 1)
    assert abs(mean_gap - 1 / rate) < 0.1 / rate, mean_gap
    assert p == with_arrivals(w, "poisson", rate=rate, seed=7)
    assert p != with_arrivals(w, "poisson", rate=rate, seed=8)
    assert all(it.arrival_s == 0.0 for it in w.items), "the input workload was modified"
    assert [it.prompt for it in p.items] == w.prompts


def test_arrival_errors():
    w = get_workload("uniform", n=2)
    with pytest.raises(ValueError, match="mode"):
        with_arrivals(w, "bursty")
    for rate in (None, 0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="rate"):
            with_arrivals(w, "poisson", rate=rate)
