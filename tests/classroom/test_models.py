"""The Classroom page's recommended model for a Chinese class (classroom/models.py,
app/components/model_choice.py): its figures agree with its config, the plan's dtype sets the
bytes a step reads, and one button puts it in the model field with its costs beside it."""

from __future__ import annotations

import re

from streamlit.testing.v1 import AppTest

from classroom.models import (
    RECOMMENDED_ZH,
    parameter_count,
    read_bandwidth,
    recommended_dtype,
    serve_args_for,
)
from engine.model.loader import ModelConfig
from engine.plan import linear_shapes
from lessons.figures import load_figures


def test_the_cited_figures_agree_with_the_models_config():
    """The model card's 494M is what its config.json's shapes add up to, and the computed bytes
    a step reads are those parameters at 2 (bf16) and 4 (float32) bytes."""
    figs = load_figures()["figures"]
    n = parameter_count(RECOMMENDED_ZH["config"])
    names = RECOMMENDED_ZH["figures"]
    assert round(n / 1e6) == figs[names["params"]]["value"]
    assert round(n * 2 / 1e9, 2) == figs[names["bfloat16"]]["value"]
    assert round(n * 4 / 1e9, 2) == figs[names["float32"]]["value"]
    # the count's rule on a config whose parameters are known: the bundled SmolLM2-135M
    smol = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
            "tie_word_embeddings": True}
    assert parameter_count(smol) == 134_515_008


def test_the_plan_chooses_the_dtype_and_the_shapes_are_the_engines():
    """The dtype is the execution plan's for this CPU (bf16 only with bf16 matrix units), and
    the shapes handed to the plan are the ones the engine's own rule gives the config."""
    from engine.plan import machine_facts

    dtype = recommended_dtype()
    assert dtype == ("bfloat16" if machine_facts().bf16_units else "float32")
    mc = ModelConfig.from_hf(RECOMMENDED_ZH["config"])
    assert (mc.head_dim, mc.qkv_bias, mc.tie_word_embeddings) == (64, True, True)
    assert linear_shapes(mc)[0] == (1152, 896) and linear_shapes(mc)[-1] == (151936, 896)
    assert serve_args_for(RECOMMENDED_ZH["hub_id"])[:2] == ["--model", RECOMMENDED_ZH["hub_id"]]


def test_read_bandwidth_is_a_rate():
    bw = read_bandwidth(nbytes=32 << 20, repeats=2)
    assert 1e8 < bw < 1e13  # between 0.1 GB/s and 10 TB/s: a rate, not a time


def _page(lang: str) -> None:
    import streamlit as st

    from app.components.model_choice import model_choice

    st.session_state["lang"] = lang
    st.session_state["chosen"] = model_choice()


def test_one_button_puts_the_recommended_model_in_the_field_with_its_costs():
    for lang in ("zh", "en"):
        at = AppTest.from_function(_page, args=(lang,), default_timeout=60).run()
        assert not at.exception, at.exception
        assert at.text_input(key="cls_model").value == "smollm2-135m"
        facts = at.caption[0].value
        # cited, computed and measured, each said so, the figures from lessons/figures.json
        kinds = ("引用", "计算", "实测") if lang == "zh" else ("cited", "computed", "measured")
        assert all(k in facts for k in kinds), facts
        assert "494" in facts and "0.99 GB" in facts and "97 MB" in facts, facts
        assert re.search(r"\d+ GB/s", facts) and re.search(r"\d+ ms", facts), facts
        at.button(key="cls_model_zh").click().run()
        assert at.text_input(key="cls_model").value == RECOMMENDED_ZH["hub_id"]
        assert at.session_state["chosen"] == RECOMMENDED_ZH["hub_id"]
        assert not at.error, [e.value for e in at.error]
