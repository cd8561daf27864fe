"""The C++ CPU kernels' library (ops.cpp, linear.cpp, matmul*.cpp): build once, load, fall back if that fails.

`load()` compiles ops.cpp, linear.cpp and matmul.cpp (and matmul_isa.cpp once per
instruction set: AVX-512, AVX2 and portable on x86-64, NEON and portable on AArch64; on x86-64
matmul_amx.cpp, the int16 kernel on AMX int8 tiles) with g++ against the installed torch's
headers (once per machine and source version), caches the library under the ServeLab cache
folder, and registers `torch.ops.servelab.{rms_norm, add_rms_norm, rope, silu_mul, store_kv,
paged_attention, decode_layers}` (ops.cpp), `{matmul, dequantize, quantize_q8, pack_q8,
matmul_q8, quantize_q16, pack_q16, matmul_q16, cpu_isa, isa_supported, q16_tiles_from_rows}`
(matmul.cpp) and
`{amx_linear, amx_available}` (linear.cpp; `amx_linear` runs only on a CPU with AMX tiles). `matmul_isa()` names the matmul's instruction set
(the machine facts pass SERVELAB_CPU_ISA to it, once: engine/plan.py; the kernels run the set
each call names, the plan's, and read no environment variable to choose one). `isa_calls()`
says which sets the kernels ran. Without a compiler `load()` returns False, says why once, and
the engine keeps to its PyTorch code (same numbers, more operator calls). `SERVELAB_CPU_OPS=0`
turns the kernels off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCES = [Path(__file__).with_name(name) for name in ("ops.cpp", "linear.cpp", "matmul.cpp")]
# the weight-streaming matmul's kernels: one source, compiled once per instruction set with that
# set's flags (never -march=native), so a wide CPU also runs, and tests force, the narrow paths
ISA_SOURCE = Path(__file__).with_name("matmul_isa.cpp")
ISA_HEADER = Path(__file__).with_name("matmul_isa.h")
PARALLEL_HEADER = Path(__file__).with_name("parallel.h")  # parallel_chunks, used by SOURCES
# the int16 kernel on AMX int8 tiles (x86-64 only; run only where the CPU and Linux allow it)
AMX_SOURCE = Path(__file__).with_name("matmul_amx.cpp")
AMX_FLAGS = ["-mamx-tile", "-mamx-int8", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2",
             "-mfma", "-mf16c"]
ISA_FLAGS = {  # name -> (SERVELAB_ISA, compiler flags)
    "portable": (0, []),                      # any CPU
    "avx2": (1, ["-mavx2", "-mfma", "-mf16c"]),  # x86-64
    "avx512": (2, ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]),
    "neon": (3, []),                          # AArch64: NEON is in its baseline
    # the AVX-512 source again with VNNI's vpdpbusd / vpdpwssd in its int8 and int16 kernels
    # (weights="gguf-q8", "gguf-q16"), which matmul.cpp runs instead of AVX-512's own where the
    # CPU has VNNI
    "avx512vnni": (2, ["-DSERVELAB_VNNI=1", "-mavx512vnni", "-mavx512f", "-mavx512bw",
                       "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]),
    # and the NEON source with ARMv8.2's sdot, which matmul.cpp runs where the CPU has it
    "neondot": (3, ["-DSERVELAB_DOTPROD=1", "-march=armv8.2-a+dotprod"]),
}


def isa_builds(machine: str | None = None) -> list[str]:
    """The instruction sets the library is built for on this machine (or `machine`, as
    platform.machine() names it): AVX-512, AVX2 and portable on x86-64, NEON and portable on
    AArch64, portable elsewhere."""
    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64"):
        return ["portable", "avx2", "avx512"]
    if machine in ("aarch64", "arm64"):
        return ["portable", "neon"]
    return ["portable"]


def isa_objects(machine: str | None = None) -> list[str]:
    """The objects matmul_isa.cpp is compiled into: one per instruction set, and the int8
    kernel's dot-product variants (not sets of their own): on x86-64 AVX-512 a second time with
    VNNI, on AArch64 NEON a second time with sdot."""
    builds = isa_builds(machine)
    return builds + [variant for base, variant in (("avx512", "avx512vnni"), ("neon", "neondot"))
                     if base in builds]


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

    sources = (*SOURCES, ISA_SOURCE, ISA_HEADER, PARALLEL_HEADER, AMX_SOURCE)
    key = hashlib.sha256(b"\0".join([*(src.read_bytes() for src in sources),
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
    objects = Path(tempfile.mkdtemp(dir=out.parent, prefix=".isa-"))
    try:
        # matmul_isa.cpp once per instruction set, its own flags; matmul_amx.cpp on x86-64
        units = [(name, ISA_SOURCE, [f"-DSERVELAB_ISA={ISA_FLAGS[name][0]}", *ISA_FLAGS[name][1]])
                 for name in isa_objects()]
        if "avx512" in isa_builds():
            units.append(("amx", AMX_SOURCE, AMX_FLAGS))
        for name, source, flags in units:
            obj = objects / f"matmul_{name}.o"
            res = subprocess.run([cxx, "-O3", "-ffp-contract=off", "-std=c++17", "-fPIC", "-c",
                                  *flags, str(source), "-o", str(obj)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"g++ failed building {source.name} for {name}:\n"
                                   f"{compiler_errors(res.stderr)}")
            cmd.append(str(obj))
        res = subprocess.run(cmd + ["-lc10", "-ltorch_cpu", "-lgomp", "-o", str(tmp_path)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            names = " ".join(src.name for src in SOURCES)
            raise RuntimeError(f"g++ failed building {names}:\n{compiler_errors(res.stderr)}")
        tmp_path.replace(out)
        for stale in out.parent.glob("servelab_cpu-*.so"):  # builds of older sources
            if stale != out:
                stale.unlink(missing_ok=True)
    finally:
        tmp_path.unlink(missing_ok=True)
        shutil.rmtree(objects, ignore_errors=True)


def compiler_errors(stderr: str, limit: int = 2000) -> str:
    """The first of g++'s error lines, else the end of its output: torch's headers print
    pages of warnings, which would hide the error at the end."""
    errors = [line for line in stderr.splitlines() if "error" in line]
    return "\n".join(errors)[:limit] if errors else stderr[-limit:]


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


# the weight-streaming matmul's paths, widest first (an x86-64 CPU has the first two, an AArch64
# one neon; every CPU portable)
ISAS = ("avx512", "avx2", "neon", "portable")


def matmul_isa(forced: str = "", source: str = "isa") -> str:
    """The weight-streaming matmul's instruction set here: `forced` (avx512, avx2, neon,
    portable; the machine facts pass SERVELAB_CPU_ISA, engine/plan.py) if given, else the
    widest this CPU supports. ValueError, naming `source`, if the forced one is unknown or this
    CPU lacks it (or treats it as missing: SERVELAB_CPU_ISA_DISABLE)."""
    if not load():
        raise ValueError("the C++ CPU kernels did not load (see the message above)")
    ops = torch.ops.servelab
    if not forced or forced == "auto":
        return ops.cpu_isa()
    known = [isa for isa in ISAS if isa in isa_builds()]
    if forced not in known:
        raise ValueError(f"{source} is {forced!r}; known instruction sets: {', '.join(known)} "
                         "(or auto)")
    if not ops.isa_supported(forced):
        raise ValueError(f"{source} asks for {forced!r}, but this CPU does not support it (it "
                         f"has: {', '.join(supported_isas())})")
    return forced


def isa_calls(reset: bool = False) -> dict[str, set[str]]:
    """Which instruction set each kernel ran since the last reset: op (matmul, matmul_q8,
    matmul_q16, decode_layers, amx_linear) -> the sets its calls were given, as the plan names
    them ("avx2", "avx512+vnni+amx", "amx" for the AMX bf16 tiles). reset=True: start anew."""
    out: dict[str, set[str]] = {}
    for entry in torch.ops.servelab.isa_calls(reset):
        op, _, isa = entry.partition(":")
        out.setdefault(op, set()).add(isa)
    return out


def has_vnni() -> bool:
    """Does this CPU have AVX-512 VNNI (the integer kernels' vpdpbusd / vpdpwssd paths,
    weights="gguf-q8" and "gguf-q16")?"""
    return "avx512_vnni" in _cpu_signature().split()


def supported_isas() -> list[str]:
    """The matmul paths this CPU can run (tests force each)."""
    return [isa for isa in ISAS if load() and torch.ops.servelab.isa_supported(isa)]
