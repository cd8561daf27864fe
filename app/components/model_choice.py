"""The Classroom page's model choice: the bundled model, or a Llama- or Qwen-family model
already on this computer (a Hugging Face folder or a GGUF file; classroom/models.py finds them). The
path is checked before any server starts; nothing is downloaded."""

from __future__ import annotations

import streamlit as st

from app.i18n import STRINGS, t
from classroom.models import find_models, serve_args_for
from engine.model.loader import BUNDLED_MODELS

STRINGS.update({
    "mc.label": {"zh": "模型（自带，或本机上的文件夹 / GGUF 文件路径）",
                 "en": "Model (bundled, or the path of a folder / GGUF file on this computer)"},
    "mc.help": {"zh": "自带的 SmolLM2-135M 只会英文、回答简短；中文课堂请用本机已有的中文模型，"
                      "例如 Qwen2.5-0.5B-Instruct 的文件夹。",
                "en": "The bundled SmolLM2-135M speaks English and answers briefly; for a class "
                      "asking in Chinese, use a Chinese model already on disk, e.g. a "
                      "Qwen2.5-0.5B-Instruct folder."},
    "mc.found": {"zh": "本机找到的模型：{models}", "en": "Models found on this computer: {models}"},
    "mc.bad": {"zh": "不能用这个模型：{msg}", "en": "Cannot use this model: {msg}"},
})


@st.cache_data(ttl=60, show_spinner=False)
def _found() -> list[str]:
    return [m["path"] for m in find_models()]


def model_choice(key: str = "cls_model") -> str | None:
    """The text field; returns the chosen model (None for the bundled default) or None with
    an error line when the path cannot be served."""
    default = next(iter(BUNDLED_MODELS))
    text = st.text_input(t("mc.label"), value=default, key=key, help=t("mc.help")).strip()
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
