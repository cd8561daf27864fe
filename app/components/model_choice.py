"""The Classroom page's model choice: the bundled model, a Llama- or Qwen-family model already
on this computer (a Hugging Face folder or a GGUF file; classroom/models.py finds them), or a
Hub id, which the class server downloads on its start. The name is checked before any server
starts. For a class that asks in Chinese, one button puts the recommended model
(classroom.models.RECOMMENDED_ZH) in the field, beside what it costs: its download and the
bytes a decode step reads (cited and computed, lessons/figures.json), and the step time those
bytes imply on this computer (computed from a read speed measured here)."""

from __future__ import annotations

import streamlit as st

from app.i18n import STRINGS, t
from classroom.models import (
    RECOMMENDED_ZH,
    find_models,
    read_bandwidth,
    recommended_dtype,
    serve_args_for,
)
from engine.model.loader import BUNDLED_MODELS
from lessons.figures import load_figures

STRINGS.update({
    "mc.label": {"zh": "模型（自带；本机上的文件夹 / GGUF 文件路径；或 Hub 上的 ORG/NAME）",
                 "en": "Model (bundled; the path of a folder / GGUF file on this computer; or "
                       "ORG/NAME on the Hub)"},
    "mc.help": {"zh": "自带的 SmolLM2-135M 只会英文、回答简短；中文课堂请用上面的按钮换成 "
                      "Qwen2.5-0.5B-Instruct，或填本机已有的中文模型的路径。",
                "en": "The bundled SmolLM2-135M speaks English and answers briefly; for a class "
                      "asking in Chinese, press the button above for Qwen2.5-0.5B-Instruct, or "
                      "give the path of a Chinese model already on disk."},
    "mc.found": {"zh": "本机找到的模型：{models}", "en": "Models found on this computer: {models}"},
    "mc.bad": {"zh": "不能用这个模型：{msg}", "en": "Cannot use this model: {msg}"},
})


@st.cache_resource(show_spinner=False)
def _bandwidth() -> float:
    return read_bandwidth()


def _recommend(key: str) -> None:
    st.session_state[key] = RECOMMENDED_ZH["hub_id"]


def recommended_zh(key: str) -> None:
    """The button that puts the recommended Chinese model in the field `key`, and its costs."""
    name = RECOMMENDED_ZH["hub_id"].split("/")[-1]
    st.button(t("mc.zh.button", name=name), key=f"{key}_zh", on_click=_recommend,
              args=(key,))
    dtype = recommended_dtype()
    dtype = dtype if dtype in ("bfloat16", "float32") else "float32"
    figs = load_figures()["figures"]
    step_bytes = figs[RECOMMENDED_ZH["figures"][dtype]]["value"] * 1e9
    bundled_bytes = figs["gguf_step_mb"]["value"] * 1e6
    bw = _bandwidth()
    st.caption(t("mc.zh.facts", name=name, dtype=dtype, step=t(f"mc.zh.step.{dtype}"),
                 nbytes=2 if dtype == "bfloat16" else 4, bw=f"{bw / 1e9:.0f} GB/s",
                 ms=f"{step_bytes / bw * 1e3:.0f} ms", ratio=f"{step_bytes / bundled_bytes:.0f}"))


@st.cache_data(ttl=60, show_spinner=False)
def _found() -> list[str]:
    return [m["path"] for m in find_models()]


def model_choice(key: str = "cls_model") -> str | None:
    """The text field; returns the chosen model (None for the bundled default) or None with
    an error line when the path cannot be served."""
    default = next(iter(BUNDLED_MODELS))
    recommended_zh(key)
    st.session_state.setdefault(key, default)  # the field's value: the button may set it
    text = st.text_input(t("mc.label"), key=key, help=t("mc.help")).strip()
    found = [p for p in _found() if p != default]
    if found:
        st.caption(t("mc.found", models=", ".join(found[:6])))
    if not text or text == default:
        return None
    try:
        serve_args_for(text)
    except ValueError as exc:
        st.error(t("mc.bad", msg=str(exc)))
        return None
    return text
