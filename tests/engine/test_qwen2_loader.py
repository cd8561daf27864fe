"""Any Qwen2-family model on disk: a tiny randomly initialised Qwen2 (q/k/v bias, tied
embeddings, its own rope theta) saved by transformers, loaded through our loader and engine,
gives transformers' greedy tokens; the serve flag and the app's model list find it."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model.loader import hf_folder, load_model
from tests.conftest import write_tiny_qwen2


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen2")
    return out, write_tiny_qwen2(out)


def test_loader_reads_qwen2_bias_tied_embeddings_and_theta(tiny_qwen2):
    folder, _ = tiny_qwen2
    loaded = load_model(str(folder), torch.float32)
    assert loaded.config.qkv_bias and loaded.config.tie_word_embeddings
    assert loaded.config.rope_theta == 1_000_000.0
    assert "layers.0.self_attn.q_proj.bias" in loaded.weights


def test_greedy_tokens_equal_transformers(tiny_qwen2):
    folder, model = tiny_qwen2
    prompts = [[5, 17, 923, 44, 1200, 7], [300, 301, 302]]
    eng = LLMEngine(EngineConfig(model=str(folder), dtype="float32", cpu_kernels=False,
                                 max_num_seqs=2, num_kv_blocks=16, max_model_len=64))
    outs = eng.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        assert out.token_ids == ref[0, len(prompt):].tolist()


def test_models_on_disk_lists_it_with_serve_args(tiny_qwen2, tmp_path):
    from classroom.models import find_models, serve_args_for

    folder, _ = tiny_qwen2
    (tmp_path / "not-a-model").mkdir()
    found = find_models([folder.parent, tmp_path])
    assert str(folder) in [m["path"] for m in found]
    entry = next(m for m in found if m["path"] == str(folder))
    assert entry["kind"] == "hf" and entry["architecture"] == "Qwen2ForCausalLM"
    assert serve_args_for(str(folder)) == ["--model", str(folder), "--served-model-name",
                                           folder.name]
    from classroom.client import DEFAULT_SWITCHES, serve_args

    argv = serve_args({**DEFAULT_SWITCHES, "model": str(folder)}, "127.0.0.1", 8000, None)
    assert argv[argv.index("--model") + 1] == str(folder)
    with pytest.raises(ValueError, match="no such"):
        serve_args_for(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="config.json"):
        serve_args_for(str(tmp_path / "not-a-model"))
    # a Hub id the class server downloads on start, served under its own name
    assert serve_args_for("Qwen/Qwen2.5-0.5B-Instruct") == [
        "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--served-model-name", "Qwen2.5-0.5B-Instruct"]
    assert serve_args_for("modelscope:qwen/Qwen3-0.6B")[1] == "modelscope:qwen/Qwen3-0.6B"


@pytest.mark.slow
def test_a_gguf_file_path_is_converted_once_and_loads(tmp_path, monkeypatch):
    """`--model FILE.gguf`: a GGUF file on disk (here the bundled one, by its path) becomes a
    cached Hugging Face folder once; a second call finds it."""
    from engine.model.loader import _bundled_gguf

    gguf = _bundled_gguf("smollm2-135m")
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    folder = hf_folder(str(gguf))
    assert folder.parent == tmp_path and (folder / "model.safetensors").is_file()
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert hf_folder(str(gguf)) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    # the conversion's parse-once memo (loader._gguf_parsed_once) is undone afterwards
    import gguf as gguf_py
    from gguf.gguf_reader import GGUFReader
    from gguf.tensor_mapping import get_tensor_name_map

    assert gguf_py.GGUFReader is GGUFReader
    assert gguf_py.get_tensor_name_map is get_tensor_name_map
