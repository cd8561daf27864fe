"""kernels/bench.py without CUDA: a clear message and exit status 2, nothing measured."""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the bench would run")
def test_bench_without_cuda_exits_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--out", str(tmp_path / "out")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bench_help():
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0 and "--out" in proc.stdout
