"""The one per-process cache of what is built from a model's files.

Loading and preparing a model is the slow part of starting an engine (reading safetensors,
fusing and packing weights, quantizing a draft), and everything built is read-only, so each
thing is built once per process and shared: by every engine (the app keeps several, one per
switch setting, each owning only its KV pools), by the server, by every browser session.
Four kinds of entries, one dict and one lock:

  "weights"  loader.load_model: host weights, config and tokenizer  (folder, dtype)
  "model"    llama.shared_model: a LlamaModel on a device, its weights fused/packed
             (folder, device, dtype, ops, weight layout)
  "gguf"     gguf.read_linear_weights: the GGUF file's raw linear rows (file path)
  "draft"    spec/draft.py: the built-in draft's quantized layers (folder, device, dtype,
             recipe); one at a time, they are large

The lock makes a second thread asking for something being built wait for it instead of
building it again (the app's sessions run in threads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

LIMITS = {"draft": 1}  # entries kept per kind (others: unlimited)

_entries: dict[tuple, object] = {}
_lock = threading.RLock()


def get(kind: str, key: tuple, build: Callable[[], T]) -> T:
    """The entry (kind, *key), built by build() the first time it is asked for."""
    full = (kind, *key)
    with _lock:
        if full not in _entries:
            limit = LIMITS.get(kind)
            if limit is not None:  # make room first: the oldest entries of this kind go
                same_kind = [k for k in _entries if k[0] == kind]
                for old in same_kind[:len(same_kind) - limit + 1]:
                    del _entries[old]
            _entries[full] = build()
        return _entries[full]  # type: ignore[return-value]


def contains(kind: str, key: tuple) -> bool:
    with _lock:
        return (kind, *key) in _entries


def clear(kind: str | None = None) -> None:
    """Forget every entry (of one kind): the next request builds it again."""
    with _lock:
        for k in [k for k in _entries if kind is None or k[0] == kind]:
            del _entries[k]
