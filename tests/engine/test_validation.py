"""Bad input raises ValueError naming the field and the allowed range."""

from __future__ import annotations

import math

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"stop": [""]}, "stop"),
])
def test_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    ({"batching": "bus"}, "batching"),
    ({"kv_layout": "hall"}, "kv_layout"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"block_size": 0}, "block_size"),
    ({"enable_prefix_caching": True, "kv_layout": "contiguous"}, "prefix_caching"),
    ({"attention_backend": "cuda"}, "attention_backend"),
    ({"cpu_kernels": "yes"}, "cpu_kernels"),
    ({"pack_weights": 1}, "pack_weights"),
])
def test_engine_config(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_spec_config():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpecConfig(num_speculative_tokens=0)
    with pytest.raises(ValueError, match="method"):
        SpecConfig(method="magic")


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        LLMEngine(EngineConfig(model="no-such-model"))


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="safetensors"):
        LLMEngine(EngineConfig(model=str(tmp_path)))


def test_pool_too_small():
    with pytest.raises(ValueError, match="needs 4 blocks"):
        LLMEngine(EngineConfig(max_model_len=64, block_size=16, num_kv_blocks=3))


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(dtype="float32", max_model_len=32))


def test_prompts(engine):
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("")
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("   ")
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("word " * 100)
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([10**9])
    assert not engine.has_unfinished(), "a rejected request must not be queued"
