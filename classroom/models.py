"""Models for the class server (`python -m classroom.serve --model NAME`): the ones the teacher
has on disk (Llama- and Qwen-family Hugging Face folders with safetensors, and GGUF files,
found without any hub access), a Hub id the server downloads on its start, and the one this
module recommends for a class that asks in Chinese (`RECOMMENDED_ZH`). Streamlit-free; the
app's Classroom page shows the list and the recommendation and passes `serve_args_for(name)`
to the server it starts.

The roots searched: `SERVELAB_MODEL_DIRS` (paths separated by os.pathsep), else
~/models, ~/.cache/servelab and the Hugging Face cache's snapshots.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.model.loader import BUNDLED_MODELS, SUPPORTED_ARCHITECTURES

MAX_DEPTH = 4  # folders below a root (the HF cache: models--x/snapshots/<hash>)

# A small Chinese-capable instruct model the engine runs (Qwen2 architecture), offered on the
# Classroom page as one button. Its config.json's numbers, so what a step reads on this
# machine is known before anything is downloaded; lessons/figures.json cites its size.
RECOMMENDED_ZH = {
    "hub_id": "Qwen/Qwen2.5-0.5B-Instruct",
    "config": {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
               "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
               "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
               "attention_bias": True, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
               "max_position_embeddings": 32768, "eos_token_id": 151645},
    "figures": {"params": "qwen25_05b_params", "download": "qwen25_05b_download",
                "float32": "qwen25_05b_step_fp32", "bfloat16": "qwen25_05b_step_bf16"},
}


def parameter_count(cfg: dict) -> int:
    """A Llama/Qwen2 model's parameters from its config: embedding, per layer the attention's
    q/k/v/o (with q/k/v biases where `attention_bias`), the SwiGLU MLP and two norms, the
    final norm, and an output layer of its own unless tied to the embedding."""
    h, layers, inter, vocab = (cfg["hidden_size"], cfg["num_hidden_layers"],
                               cfg["intermediate_size"], cfg["vocab_size"])
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attn = h * (q + 2 * kv) + q * h + ((q + 2 * kv) if cfg.get("attention_bias") else 0)
    per_layer = attn + 3 * h * inter + 2 * h
    head = 0 if cfg.get("tie_word_embeddings") else vocab * h
    return vocab * h + layers * per_layer + h + head


def recommended_dtype(rec: dict = RECOMMENDED_ZH) -> str:
    """The dtype this machine's execution plan gives the recommended model (dtype "auto", as
    the class server starts it): bfloat16 where the CPU has bf16 matrix units, else float32."""
    from engine import EngineConfig
    from engine.model.loader import ModelConfig
    from engine.plan import ModelFacts, plan_for

    facts = ModelFacts.of(rec["hub_id"], ModelConfig.from_hf(rec["config"]))
    return plan_for(EngineConfig(model=rec["hub_id"]), facts).dtype


def default_roots() -> list[Path]:
    env = os.environ.get("SERVELAB_MODEL_DIRS")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    home = Path.home()
    hf = Path(os.environ.get("HF_HOME", home / ".cache" / "huggingface")) / "hub"
    return [home / "models", Path(os.environ.get("SERVELAB_CACHE", home / ".cache/servelab")), hf]


def describe_folder(path: Path) -> dict | None:
    """A Hugging Face folder we can load, as {"path", "kind", "architecture"}; else None."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else cfg.get("model_type", "?")
    if arch not in SUPPORTED_ARCHITECTURES or not any(path.glob("*.safetensors")):
        return None
    return {"path": str(path), "kind": "hf", "architecture": arch}


def find_models(roots: list[Path] | None = None) -> list[dict]:
    """Every loadable model under `roots`: the bundled names first, then folders and GGUF
    files, each once."""
    found = [{"path": name, "kind": "bundled", "architecture": "LlamaForCausalLM"}
             for name in BUNDLED_MODELS]
    seen: set[str] = set()
    for root in roots if roots is not None else default_roots():
        root = Path(root)
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            depth = len(Path(dirpath).relative_to(root).parts)
            if depth >= MAX_DEPTH:
                dirnames[:] = []
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            here = Path(dirpath)
            if "config.json" in filenames and (entry := describe_folder(here)):
                if entry["path"] not in seen:
                    seen.add(entry["path"])
                    found.append(entry)
            for f in filenames:
                if f.lower().endswith(".gguf") and str(here / f) not in seen:
                    seen.add(str(here / f))
                    found.append({"path": str(here / f), "kind": "gguf", "architecture": "?"})
    return found


def serve_args_for(model: str) -> list[str]:
    """The class server's flags for `model` (a bundled name, a folder, a .gguf file or a Hub
    id);
    ValueError naming what is wrong before any server starts."""
    if model in BUNDLED_MODELS:
        return ["--model", model]
    path = Path(model).expanduser()
    if not path.exists():
        from engine.model.hub import is_remote_name

        # a Hub id (ORG/NAME, or modelscope:ORG/NAME): the class server downloads it through
        # HF_ENDPOINT's mirror on its start (engine/model/hub.py), and refuses an
        # architecture it cannot run before any weight file
        if is_remote_name(model):
            return ["--model", model, "--served-model-name", model.split("/")[-1]]
        raise ValueError(f"no such model folder or file, and not a Hub id (ORG/NAME): {path}")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path} is not a .gguf file or a Hugging Face folder")
        return ["--model", str(path), "--served-model-name", path.stem]
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a Hugging Face model folder (no config.json)")
    if describe_folder(path) is None:
        raise ValueError(f"{path}: not a Llama- or Qwen-family model with safetensors weights "
                         f"({', '.join(SUPPORTED_ARCHITECTURES)})")
    # clients see the folder's name, not where it lies on the teacher's disk
    return ["--model", str(path), "--served-model-name", path.name]


def read_bandwidth(nbytes: int = 256 << 20, repeats: int = 3) -> float:
    """This machine's memory read speed now, in bytes per second: the best of `repeats` sums
    over a buffer larger than any cache, with torch's threads (as a decode step reads its
    weights). A floor for a step's time is the bytes it reads divided by this."""
    import time

    import torch

    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    buf.sum()  # the pages touched and the threads up before timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best
