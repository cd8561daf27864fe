"""Loading: local Hugging Face folders of the Llama family, and clear errors for bad ones.

Tiny random Llama / Qwen2 (q/k/v bias) / Qwen3 (q/k norm) models are built here with
transformers, and our forward must give transformers' greedy tokens exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model.loader import ModelLoadError, hf_folder

ROOT = Path(__file__).resolve().parents[2]


def _tiny(kind: str, path, tokenizer_src):
    import transformers as tf

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=True)
    if kind == "llama":
        cfg, cls = tf.LlamaConfig(**common, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), tf.LlamaForCausalLM
    elif kind == "qwen2":
        cfg, cls = tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    else:
        cfg, cls = tf.Qwen3Config(**common, head_dim=16), tf.Qwen3ForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():  # larger weights than the init, so tokens vary and norms matter
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0).add_(0.05 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tokenizer_src).save_pretrained(path)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tiny_models_match_transformers(kind, tmp_path):
    model = _tiny(kind, tmp_path, hf_folder("smollm2-135m"))
    prompts = [[5, 17, 300, 42, 7], [1000, 2000, 3000]]
    eng = LLMEngine(EngineConfig(model=str(tmp_path), dtype="float32", max_model_len=64,
                                 block_size=4))
    outs = eng.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    for p, o in zip(prompts, outs):
        ref = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert o.token_ids == ref, kind
    assert len({tuple(o.token_ids) for o in outs}) == 2


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                       "model_type": "gpt2"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="unsupported architecture 'GPT2LMHeadModel'"):
        LLMEngine(EngineConfig(model=str(tmp_path)))


def test_corrupt_weights_file(tmp_path):
    cfg = json.loads((hf_folder("smollm2-135m") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors file")
    with pytest.raises(ModelLoadError, match="corrupt or unreadable weights file"):
        LLMEngine(EngineConfig(model=str(tmp_path), dtype="float32"))


def test_pickle_only_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelLoadError, match="pickle files are not loaded"):
        hf_folder(str(tmp_path))


def test_the_bundled_gguf_is_readable_on_a_fresh_machine():
    """The bundled model's first start converts its GGUF file with transformers, which refuses
    a GGUF file unless accelerate and gguf are installed. A warm cache never converts, so a
    missing one shows only on a fresh machine (every engine there fails): check it here."""
    from transformers.utils import is_accelerate_available, is_gguf_available

    assert is_accelerate_available(), "pyproject.toml must depend on accelerate (GGUF reading)"
    assert is_gguf_available(), "pyproject.toml must depend on gguf (GGUF reading)"


def test_two_processes_convert_one_at_a_time(tmp_path):
    """The conversion's lock holds across processes (two test workers or two servers starting
    on an empty cache): the second waits for the first, then finds the folder made."""
    import subprocess
    import sys

    code = ("import sys, time; from pathlib import Path; from engine.model import loader\n"
            "with loader._converting(Path(sys.argv[1]) / 'm'):\n"
            "    print(time.time(), flush=True); time.sleep(1.0); print(time.time())\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    spans = sorted(tuple(map(float, p.communicate(timeout=120)[0].split())) for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert spans[0][1] <= spans[1][0], f"both held the lock at once: {spans}"


def test_cache_is_a_plain_hf_folder():
    folder = hf_folder("smollm2-135m")
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())


def test_one_cache_holds_the_weights_and_the_built_model():
    """Engines, the app and the draft all load through engine/model/weights_cache.py: the second
    engine reuses the first one's weights and model."""
    from engine.model.loader import is_loaded, load_model

    a = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=1))
    b = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=2, kv_layout="contiguous"))
    assert a.model is b.model and a.pool is not b.pool
    assert is_loaded("smollm2-135m", torch.float32)
    assert load_model("smollm2-135m", torch.float32) is a.model.loaded


def test_cache_builds_once_across_threads_and_keeps_one_draft():
    from concurrent.futures import ThreadPoolExecutor

    from engine.model import weights_cache

    calls = []

    def build():
        calls.append(1)
        return object()

    try:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: weights_cache.get("test", (1,), build), range(8)))
        assert len(calls) == 1 and all(g is got[0] for g in got)
        first = weights_cache.get("draft", ("test-a",), object)
        assert weights_cache.get("draft", ("test-a",), object) is first
        weights_cache.get("draft", ("test-b",), object)  # a second draft replaces the first
        assert not weights_cache.contains("draft", ("test-a",)) and weights_cache.contains("draft", ("test-b",))
    finally:
        weights_cache.clear("test")
        weights_cache.clear("draft")


def test_the_repos_kernels_folder_does_not_shadow_pypis_kernels():
    """transformers imports PyPI's `kernels` while it reads a GGUF file. This repo's Triton
    kernels live in a folder of that name, imported as `servelab_kernels`: the folder has no
    `__init__.py`, so `import kernels`, even from the repo root, finds the installed package."""
    import importlib.metadata as md
    import importlib.util
    from pathlib import Path

    import servelab_kernels

    folder = Path(servelab_kernels.__path__[0])
    assert folder.name == "kernels" and (folder / "store_kv.py").is_file()
    assert not (folder / "__init__.py").exists()
    spec = importlib.util.find_spec("kernels")
    assert spec is not None and spec.origin is not None, "PyPI's kernels is not installed"
    assert Path(spec.origin).parent != folder
    files = md.distribution("kernels").files
    assert any(str(f) == "kernels/__init__.py" for f in files)
