"""Models the teacher has on disk, for the class server (`python -m classroom.serve --model
PATH`): Llama- and Qwen-family Hugging Face folders (config.json + safetensors) and GGUF
files. No hub access: only what is already on this machine. Streamlit-free; the app's
Classroom page shows the list and passes `serve_args_for(path)` to the server it starts.

The roots searched: `SERVELAB_MODEL_DIRS` (paths separated by os.pathsep), else
~/models, ~/.cache/servelab and the Hugging Face cache's snapshots.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.model.loader import BUNDLED_MODELS, SUPPORTED_ARCHITECTURES

MAX_DEPTH = 4  # folders below a root (the HF cache: models--x/snapshots/<hash>)


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
