"""A model by its Hub id: `--model ORG/NAME` downloads through huggingface_hub, or
`--model modelscope:ORG/NAME` through ModelScope, into that library's own cache.

Read at call time, not at import (a test, or a notebook, may set them after huggingface_hub
is imported): HF_ENDPOINT (a mirror such as https://hf-mirror.com), HF_TOKEN (private or gated
repositories), HF_HUB_OFFLINE (the cache only), HF_HUB_CACHE / HF_HOME (where the cache is).

Order of work: config.json alone first, so a model of an architecture the engine cannot run
is refused before any weight file is fetched; then only the files the engine reads
(configuration, tokenizer, safetensors and their index), never pickle or GGUF files. Progress
bars and resuming a broken download are huggingface_hub's own. Every failure becomes a
ModelLoadError whose message names the repository, the endpoint and what to do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import threading
from pathlib import Path

from engine.model.architectures import SUPPORTED_ARCHITECTURES, ModelLoadError, architecture_of

DEFAULT_ENDPOINT = "https://huggingface.co"
MIRROR_HINT = "HF_ENDPOINT=https://hf-mirror.com"
MODELSCOPE_PREFIX = "modelscope:"

# What the engine reads from a model folder: nothing else is downloaded.
ALLOW_PATTERNS = [
    "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
    "*.safetensors", "*.safetensors.index.json",
]
# The engine reads the folder's top level only, and a Mistral-style consolidated file repeats
# the sharded weights under other names: neither is worth the bytes.
IGNORE_PATTERNS = ["*/*", "consolidated*.safetensors"]

# The Hub's own rule for a repository id: ORG/NAME, letters, digits, '-', '_', '.', neither
# part starting or ending with '-' or '.', no '--' or '..'.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"{_PART}/{_PART}")
MAX_ID_LENGTH = 96

# Hub id -> folder resolved by this process: the engine asks for the folder more than once
# while it starts, and every ask must name the same snapshot without asking the network again.
_resolved: dict[str, Path] = {}
_lock = threading.Lock()


def looks_like_hub_id(name: str) -> bool:
    return (len(name) <= MAX_ID_LENGTH and bool(_HUB_ID.fullmatch(name))
            and "--" not in name and ".." not in name)


def is_remote_name(name: str) -> bool:
    """Does `name` (one that is no file or folder here) name a model on a hub?"""
    return name.startswith(MODELSCOPE_PREFIX) or looks_like_hub_id(name)


def resolved_folder(name: str) -> Path | None:
    """The folder this process resolved `name` to already, else None (no network)."""
    return _resolved.get(name)


def _env_true(var: str) -> bool:
    return os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    from huggingface_hub import constants

    # a flag set before huggingface_hub was imported is in its constants, one set later only
    # in the environment: either means no network
    return (_env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")
            or constants.HF_HUB_OFFLINE)


def hub_cache() -> Path:
    """huggingface_hub's cache folder by its own rules, from the environment as it is now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def _check_architecture(config_file: Path, where: str) -> None:
    try:
        cfg = json.loads(Path(config_file).read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{where}: could not read its config.json: {exc}") from exc
    arch = architecture_of(cfg)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{where}: unsupported architecture {arch!r}; ServeLab runs "
            f"{list(SUPPORTED_ARCHITECTURES)}. Only its config.json was downloaded."
        )


def _check_weights(folder: Path, where: str) -> Path:
    if not any(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"{where} has no *.safetensors weights at its top level (ServeLab never loads "
            f"pickle *.bin / *.pt files); pick a repository that ships safetensors, or convert "
            f"one with transformers' save_pretrained(safe_serialization=True)"
        )
    return folder


def hub_folder(repo_id: str, progress=None) -> Path:
    """The local snapshot folder of Hugging Face repository `repo_id`, downloaded if needed."""
    with _lock:
        known = _resolved.get(repo_id)
        if known is not None and known.is_dir():
            return known
        folder = _download_hf(repo_id, progress)
        _resolved[repo_id] = folder
        return folder


def _download_hf(repo_id: str, progress) -> Path:
    try:
        import httpx2
        from huggingface_hub import errors, hf_hub_download, snapshot_download
    except ImportError as exc:
        raise ModelLoadError(
            f"--model {repo_id} downloads from the Hugging Face Hub, which needs the "
            f"huggingface_hub package: pip install huggingface_hub ({exc})"
        ) from exc

    endpoint, offline, cache = hub_endpoint(), hub_offline(), hub_cache()
    where = f"Hugging Face repository {repo_id!r} ({endpoint})"
    common = dict(cache_dir=str(cache), endpoint=endpoint, local_files_only=offline)
    if progress:
        progress(0.0, f"{'reading the cache for' if offline else 'downloading'} {repo_id} "
                      f"from {endpoint}")
    try:
        _check_architecture(Path(hf_hub_download(repo_id, "config.json", **common)), where)
        folder = Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS,
                                        ignore_patterns=IGNORE_PATTERNS, **common))
    except ModelLoadError:
        raise
    except errors.GatedRepoError as exc:
        raise ModelLoadError(
            f"{where} is gated: accept its terms on the model's page, then set HF_TOKEN to an "
            f"access token of that account (HF_TOKEN=hf_...)"
        ) from exc
    except errors.RepositoryNotFoundError as exc:
        raise ModelLoadError(
            f"{where} not found: check the name (ORG/NAME, as on the model's page) and the "
            f"endpoint; a private or gated repository needs an access token in HF_TOKEN"
        ) from exc
    except errors.RevisionNotFoundError as exc:
        raise ModelLoadError(f"{where}: its main branch was not found ({exc})") from exc
    except errors.RemoteEntryNotFoundError as exc:
        raise ModelLoadError(
            f"{where} has no config.json: not a transformers model repository (for a GGUF-only "
            f"repository, download the .gguf file and pass its path to --model)"
        ) from exc
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled,
            httpx2.TransportError) as exc:
        # no answer from the endpoint (or none allowed) and the cache does not hold the model
        if offline:
            raise ModelLoadError(
                f"{repo_id!r} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is "
                f"set: download it once with the network on (unset HF_HUB_OFFLINE), or point "
                f"HF_HOME at a cache that holds it"
            ) from exc
        raise ModelLoadError(
            f"could not reach {endpoint} to download {repo_id!r}, and the Hugging Face cache "
            f"({cache}) does not hold it. Check the network; where huggingface.co is blocked, "
            f"use a mirror: {MIRROR_HINT}"
        ) from exc
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise ModelLoadError(
            f"{endpoint} answered HTTP {status} for {repo_id!r}; try again later, or another "
            f"endpoint ({MIRROR_HINT}); a private repository needs HF_TOKEN"
        ) from exc
    except OSError as exc:  # the cache folder: disk full, no permission
        raise ModelLoadError(f"could not write {repo_id!r} into {cache}: {exc}") from exc
    except Exception as exc:  # whatever else the client raises: named, never a traceback
        raise ModelLoadError(
            f"could not download {repo_id!r} from {endpoint}: {type(exc).__name__}: {exc}"
        ) from exc
    return _check_weights(folder, where)


def modelscope_folder(name: str, progress=None) -> Path:
    """`modelscope:ORG/NAME`: the snapshot folder ModelScope's own client downloads."""
    model_id = name.removeprefix(MODELSCOPE_PREFIX)
    if not looks_like_hub_id(model_id):
        raise ModelLoadError(f"{name!r}: a ModelScope model is named modelscope:ORG/NAME")
    if importlib.util.find_spec("modelscope") is None:
        raise ModelLoadError(
            f"{name!r} downloads from ModelScope, which needs its client: pip install modelscope"
        )
    with _lock:
        known = _resolved.get(name)
        if known is not None and known.is_dir():
            return known
        from modelscope import snapshot_download

        where = f"ModelScope model {model_id!r}"
        if progress:
            progress(0.0, f"downloading {model_id} from ModelScope")
        try:
            first = Path(snapshot_download(model_id, allow_patterns=["config.json"]))
            _check_architecture(first / "config.json", where)
            folder = Path(snapshot_download(model_id, allow_patterns=ALLOW_PATTERNS,
                                            ignore_patterns=IGNORE_PATTERNS))
        except ModelLoadError:
            raise
        except Exception as exc:  # ModelScope's errors: named, never a traceback
            raise ModelLoadError(
                f"could not download {where}: {type(exc).__name__}: {exc} (check the name and "
                f"the network; a private model needs `modelscope login`)"
            ) from exc
        _resolved[name] = _check_weights(folder, where)
        return folder
