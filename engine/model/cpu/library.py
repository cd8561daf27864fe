"""The C++ CPU kernels' library (ops.cpp, linear.cpp): build once, load, fall back if that fails.

`load()` compiles ops.cpp and linear.cpp with g++ against the installed torch's
headers (about 20 s, once per machine and source version), caches the library under the
ServeLab cache folder, and registers `torch.ops.servelab.{rms_norm, add_rms_norm, rope,
silu_mul, store_kv, paged_attention, decode_layers}` and, on a CPU with AMX, `amx_linear`
(`amx_available()`). Without a compiler it returns False, says why once, and the engine keeps
to its PyTorch code (same numbers, more operator calls). `SERVELAB_CPU_OPS=0` turns the
kernels off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCES = [Path(__file__).with_name(name) for name in ("ops.cpp", "linear.cpp")]


def _cpu_signature() -> str:
    """The CPU's flags: the library is built with -march=native, so it is one per CPU kind."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return "unknown"


def capability_flags() -> list[str]:
    """Build ATen's Vectorized for the instruction set torch dispatches its own kernels to
    here, so our vector loops call the same exp and round the same way."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap in ("AVX512", "AVX2"):
        return [f"-DCPU_CAPABILITY={cap}", f"-DCPU_CAPABILITY_{cap}"]
    return ["-DCPU_CAPABILITY=DEFAULT"]


def library_path() -> Path:
    from engine.model.loader import cache_root

    key = hashlib.sha256(b"\0".join([*(src.read_bytes() for src in SOURCES),
                                     torch.__version__.encode(),
                                     sys.version.encode(), _cpu_signature().encode(),
                                     " ".join(capability_flags()).encode()]))
    return cache_root() / "cpu_kernels" / f"servelab_cpu-{key.hexdigest()[:16]}.so"


def build(out: Path) -> None:
    """g++ SOURCES -> out (written to a temporary file first, then renamed)."""
    from torch.utils import cpp_extension

    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # -ffp-contract=off: no fused multiply-adds, so a * b + c rounds twice, as ATen's
    # separate mul and add do
    cmd = [cxx, "-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *capability_flags(), *map(str, SOURCES)]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    for lib in cpp_extension.library_paths():
        cmd += [f"-L{lib}", f"-Wl,-rpath,{lib}"]
    # at::parallel_for is OpenMP in torch's CPU build; -lgomp finds the libgomp torch ships
    # (torch/lib), so the process keeps one OpenMP runtime and one thread pool
    cmd += ["-fopenmp"]
    with tempfile.NamedTemporaryFile(dir=out.parent, suffix=".so", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        res = subprocess.run(cmd + ["-lc10", "-ltorch_cpu", "-lgomp", "-o", str(tmp_path)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            names = " ".join(src.name for src in SOURCES)
            raise RuntimeError(f"g++ failed building {names}:\n{res.stderr[-2000:]}")
        tmp_path.replace(out)
        for stale in out.parent.glob("servelab_cpu-*.so"):  # builds of older sources
            if stale != out:
                stale.unlink(missing_ok=True)
    finally:
        tmp_path.unlink(missing_ok=True)


@functools.lru_cache(maxsize=1)
def load() -> bool:
    """Build (if needed) and load the kernels; True if torch.ops.servelab is ready."""
    if os.environ.get("SERVELAB_CPU_OPS", "1") == "0":
        return False
    try:
        path = library_path()
        if not path.exists():
            print(f"[servelab] building the C++ CPU kernels into {path.parent} (once) ...",
                  file=sys.stderr, flush=True)
            build(path)
        torch.ops.load_library(str(path))
        return True
    except Exception as exc:  # no compiler, no headers, a failed build: the PyTorch path
        print(f"[servelab] C++ CPU kernels unavailable, using PyTorch ops: {exc}",
              file=sys.stderr)
        return False


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """True if the kernels serve a model on this device in this dtype (building them if needed)."""
    return (device.type == "cpu"
            and dtype in (torch.float32, torch.bfloat16, torch.float16) and load())


@functools.lru_cache(maxsize=1)
def amx_available() -> bool:
    """True if the kernels loaded and this CPU (and Linux) lets them use AMX bf16 tiles."""
    return load() and torch.ops.servelab.amx_available()
