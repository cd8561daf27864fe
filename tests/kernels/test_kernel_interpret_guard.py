"""TRITON_INTERPRET stays in the interpreter tests, and Triton on CUDA refuses to run under it.

This module runs in the ordinary test process (not in the interpreter children that
tests/kernels/conftest.py starts), so it also checks that the confinement holds.
"""

import os

import pytest
import torch
from servelab_kernels._common import interpreting
from servelab_kernels.store_kv import store_kv

from engine.model.attention.triton_backend import TritonAttention

parent_process = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1",
    reason="this run was started with TRITON_INTERPRET=1 for every test",
)


@parent_process
def test_ordinary_test_process_compiles_the_kernels():
    assert "TRITON_INTERPRET" not in os.environ
    assert not interpreting(), "kernels.* were imported under TRITON_INTERPRET in this process"


def test_cuda_refused_while_the_variable_is_set(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        TritonAttention.check_device(torch.device("cuda"))
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        TritonAttention.check_device("cuda:0")
    TritonAttention.check_device("cpu")  # the interpreter on CPU tensors is what tests use


@parent_process
def test_cuda_allowed_when_compiled_and_unset(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    TritonAttention.check_device("cuda")


def test_kernel_calls_check_their_tensors_too(monkeypatch):
    """A kernel called directly (not through the engine) with CUDA tensors refuses as well."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device for CUDA tensors")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pool = torch.zeros((2, 4, 1, 16), device="cuda")
    new = torch.ones((1, 1, 16), device="cuda")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        store_kv(pool, pool.clone(), new, new, torch.zeros(1, dtype=torch.long, device="cuda"))


def test_engine_refuses_triton_on_cuda_under_the_interpreter(monkeypatch, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: the engine checks where it builds the backend")
    from benchmarks.gpu.tiny import save_tiny_llama
    from engine import EngineConfig, LLMEngine

    folder = save_tiny_llama(tmp_path / "tiny")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        LLMEngine(EngineConfig(model=str(folder), device="cuda", attention_backend="triton",
                               num_kv_blocks=8, max_model_len=64))
