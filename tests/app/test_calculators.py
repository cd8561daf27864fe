"""The calculators (app/calculators.py) on hand-worked cases (no model, no browser)."""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.calculators import (  # noqa: E402
    SHAPES,
    ModelShape,
    bus_sum,
    kv_bytes,
    parse_lengths,
    roofline_rows,
    tokens_per_pass,
)


def test_kv_bytes_of_a_7b_model_is_half_a_megabyte_per_token_in_fp16():
    llama7b = next(s for s in SHAPES if s.name.startswith("Llama-2-7B"))
    assert kv_bytes(llama7b, 2) == 2 * 32 * 32 * 128 * 2 == 524_288
    assert kv_bytes(llama7b, 2, 2048) == 1 << 30, "a 2048-token conversation holds 1 GiB"
    smol = SHAPES[0]
    assert kv_bytes(smol, 2) == 2 * 30 * 3 * 64 * 2
    with pytest.raises(ValueError, match="kv_heads must be at least 1"):
        kv_bytes(ModelShape("x", 2, 0, 64), 2)


def test_the_bus_sum_by_hand():
    # 2 seats; batches (10, 2) and (4, 4): static runs 10 + 4 steps over 2 seats = 28 seat-steps
    res = bus_sum([10, 2, 4, 4], 2)
    assert res["useful"] == 20 and res["static_steps"] == 14
    assert res["static_seat_steps"] == 28 and res["static_useful_frac"] == pytest.approx(20 / 28)
    # continuous: seat A takes 10; seat B takes 2, then 4 (ends 6), then 4 (ends 10)
    assert res["continuous_steps"] == 10
    assert bus_sum([5, 5, 5, 5], 2)["static_useful_frac"] == 1.0, "equal answers waste nothing"
    with pytest.raises(ValueError, match="seats"):
        bus_sum([1], 0)


@pytest.mark.parametrize("text,message", [("", "at least one"), ("3, x", "'x'"),
                                          ("0", "'0'"), ("-2", "'-2'")])
def test_bad_answer_lengths_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_lengths(text)
    assert parse_lengths("8, 12 40") == [8, 12, 40]


def test_tokens_per_pass_and_the_roofline_rows():
    assert tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    reps = [{"step": 1, "wall_s": 0.02, "num_batched_tokens": 16},
            {"step": 2, "wall_s": 0.0, "num_batched_tokens": 0}]
    rows = roofline_rows(reps, 200_000_000)
    assert rows == [{"step": 1, "tokens": 16, "ms": pytest.approx(20.0),
                     "gb_s": pytest.approx(10.0)}]
