"""What the loader (engine/model/loader.py) and the Hub download (engine/model/hub.py) both
need to know about a model before reading its weights: which architectures the engine runs,
how a config.json names its architecture, and the error either raises. A module of its own so
that neither of the two imports the other."""

from __future__ import annotations

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "MistralForCausalLM")


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says which file and why."""


def architecture_of(cfg: dict) -> str:
    """The transformers class a config.json names (its model_type when it names none)."""
    archs = cfg.get("architectures") or []
    return archs[0] if archs else {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                   "qwen3": "Qwen3ForCausalLM"}.get(cfg.get("model_type"), "?")
