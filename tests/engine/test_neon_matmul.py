"""The NEON (AArch64) weight-streaming matmul, tested on this x86-64 machine.

engine/model/cpu/matmul_isa.cpp has a NEON build (SERVELAB_ISA=3) that library.py compiles on
an ARM CPU (Apple silicon under Linux, Graviton, a Raspberry Pi 5). Here it is cross-compiled
with Debian's g++-aarch64-linux-gnu, together with the portable build and a small driver with
no torch (tests/native/matmul_driver.cpp), and run under qemu-aarch64. The same properties as
tests/engine/test_cpu_matmul.py holds for the x86 paths: the dequantized weights equal
gguf-py's to the bit; the product equals the exact one within fp32 accumulation-order error; every row's result
is the same bits whatever the other rows, their number and the split of the columns. The int8
kernel (weights="gguf-q8"), plain NEON and with ARMv8.2's sdot, gives the same bits as the x86
AVX2 kernel on this machine (both scale the same exact integer sums with the same fused
multiply-adds), and the portable one the same bits as its x86 build.

qemu runs the instructions, not the speed: these tests say nothing of how fast NEON is.
Without the two tools (`apt install g++-aarch64-linux-gnu qemu-user`; .ci/run installs them)
the tests skip, saying so.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import q4_1_edge_blocks, require

pytestmark = pytest.mark.heavy  # cross-compiled and run under qemu

ROOT = Path(__file__).resolve().parents[2]
CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
FORMATS = {"bf16": 0, "q8_0": 1, "q4_1": 2}
PATHS = ["neon", "portable"]
OPS = {"matmul": 0, "dequantize": 1, "matmul_q8": 2, "matmul_q16": 3}


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    missing = [tool for tool in (CXX, QEMU) if shutil.which(tool) is None]
    require(not missing, f"{' and '.join(missing)} not on PATH: apt install "
            "g++-aarch64-linux-gnu qemu-user to test the NEON matmul here")
    out = tmp_path_factory.mktemp("neon")
    source = ROOT / "engine/model/cpu/matmul_isa.cpp"
    from engine.model.cpu.library import ISA_FLAGS, isa_objects

    # every object at once (the compiles are independent), then one link
    commands = {}
    for name in isa_objects("aarch64"):  # neon, neondot, portable: library.py's flags for each
        code, flags = ISA_FLAGS[name]
        commands[out / f"{name}.o"] = [CXX, "-O3", "-ffp-contract=off", "-std=c++17", "-c",
                                       f"-DSERVELAB_ISA={code}", *flags, str(source)]
    commands[out / "matmul_driver.o"] = [CXX, "-O2", "-std=c++17", "-c",
                                         str(ROOT / "tests/native/matmul_driver.cpp")]
    jobs = {obj: subprocess.Popen([*cmd, "-o", str(obj)]) for obj, cmd in commands.items()}
    for obj, job in jobs.items():
        assert job.wait(timeout=600) == 0, f"{CXX} failed to build {obj.name}"
    exe = out / "matmul_driver"
    subprocess.run([CXX, "-static", *map(str, jobs), "-o", str(exe)], check=True)
    return exe


def run(driver: Path, isa: str, fmt: str, raw: np.ndarray, k: int, pool: np.ndarray,
        calls: list[tuple[str, int, list[int]]]) -> list[np.ndarray]:
    """Each call ("matmul", "matmul_q8" or "matmul_q16", split, row indices) or ("dequantize",
    0, []) under qemu; results. For "matmul_q8" / "matmul_q16", `raw` is the weight as pack_q8 /
    pack_q16 regroups it."""
    work = driver.parent
    n = raw.shape[0]
    plan = [len(calls)]
    for op, split, idx in calls:
        plan += [OPS[op], split, len(idx), *idx]
    (work / "w.bin").write_bytes(np.ascontiguousarray(raw).tobytes())
    (work / "pool.bin").write_bytes(np.ascontiguousarray(pool, dtype=np.float32).tobytes())
    (work / "plan.bin").write_bytes(np.array(plan, dtype=np.int32).tobytes())
    subprocess.run([QEMU, str(driver), isa, str(FORMATS[fmt]), str(k), *(
        str(work / f) for f in ("w.bin", "pool.bin", "plan.bin", "out.bin"))],
        check=True, timeout=300)
    flat = np.fromfile(work / "out.bin", dtype=np.float32)
    results, at = [], 0
    for op, _, idx in calls:
        shape = (n, k) if op == "dequantize" else (len(idx), n)
        size = shape[0] * shape[1]
        results.append(flat[at:at + size].reshape(shape))
        at += size
    assert at == flat.size
    return results


@pytest.fixture(scope="module")
def weights():
    """fmt -> (rows as stored, gguf-py's fp32 weights, K): real Q4_1 and Q8_0 rows from the
    bundled file, synthetic Q4_1 blocks with edge scales, random bf16."""
    import gguf
    from gguf import GGUFReader

    from engine.model.loader import _bundled_gguf

    tensors = {t.name: t for t in GGUFReader(str(_bundled_gguf("smollm2-135m"))).tensors}
    out = {}
    for fmt, name, rows in (("q4_1", "blk.3.ffn_gate.weight", 160),
                            ("q8_0", "token_embd.weight", 96)):
        raw = np.array(tensors[name].data[:rows])
        out[fmt] = (raw, gguf.quants.dequantize(raw, tensors[name].tensor_type)
                    .astype(np.float32), 576)
    edge, edge_ref = q4_1_edge_blocks()
    out["q4_1_edges"] = (edge, edge_ref, 256)
    g = np.random.default_rng(0)
    bits = g.standard_normal((64, 576)).astype(np.float32) * 0.05
    bf16 = (bits.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16
    out["bf16"] = (bf16.view(np.uint8).reshape(64, 2 * 576),
                   (bf16.astype(np.uint32) << 16).view(np.float32), 576)
    return out


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("name", ["q4_1", "q8_0", "q4_1_edges", "bf16"])
def test_dequantize_equals_gguf_py(driver, weights, isa, name):
    raw, ref, k = weights[name]
    fmt = name.removesuffix("_edges")
    (got,) = run(driver, isa, fmt, raw, k, np.zeros((1, k), np.float32), [("dequantize", 0, [])])
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "bf16"])
def test_matmul_within_accumulation_error_and_batch_invariant(driver, weights, isa, fmt):
    """One qemu run: every row alone, then batches of every size 1 to 10 (the register paths
    of a decode step and a verification pass, and the panel after them) and random ones to 40,
    rows drawn at random, the columns split in runs of 16 (as threads take them) or whole."""
    raw, ref, k = weights[fmt]
    g = np.random.default_rng(3)
    pool = g.standard_normal((48, k)).astype(np.float32)
    rng = random.Random(f"{fmt}-{isa}")
    sizes = [*range(1, 11), *(rng.randint(11, 40) for _ in range(4))]
    batches = [[rng.randrange(len(pool)) for _ in range(size)] for size in sizes]
    calls = ([("matmul", raw.shape[0], [i]) for i in range(len(pool))]
             + [("matmul", rng.choice([16, raw.shape[0]]), idx) for idx in batches])
    results = run(driver, isa, fmt, raw, k, pool, calls)
    alone = np.concatenate(results[:len(pool)])
    exact = pool.astype(np.float64) @ ref.astype(np.float64).T
    bound = (k + 4) * 2.0 ** -24 * (np.abs(pool).astype(np.float64) @ np.abs(ref).T) + 1e-30
    assert (np.abs(alone - exact) <= bound).all()
    for idx, got in zip(batches, results[len(pool):]):
        assert np.array_equal(got.view(np.uint32), alone[idx].view(np.uint32)), len(idx)


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q4_1_edges"])
def test_integer_kernels_give_the_x86_bits_and_are_batch_invariant(driver, weights, fmt, bits):
    """weights="gguf-q8" (bits 8) and "gguf-q16" (bits 16) on ARM: NEON (for int8 with and
    without sdot) and portable, each in one qemu run of every row alone and batches of 1-5, 8
    and 13 rows, the columns split in runs of 16 or whole. Every row equals, bit for bit, what
    this machine's kernels compute (AVX2 for the NEON builds, x86's portable build for ARM's),
    so the x86 tests' error bounds hold on ARM."""
    import torch

    from engine.model.cpu import library

    assert library.load(), "the C++ CPU kernels did not build (see the message above)"
    ops = torch.ops.servelab
    if not ops.isa_supported("avx2"):
        pytest.skip("this x86-64 CPU has no AVX2 to compare NEON's int8 kernel with")
    raw, _, k = weights[fmt]
    if raw.shape[0] % 16:  # the edge blocks: 8 columns, twice (a group is 16)
        raw = np.concatenate([raw, raw[::-1]])
    pack, matmul = ((ops.pack_q8, ops.matmul_q8) if bits == 8
                    else (ops.pack_q16, ops.matmul_q16))
    op = f"matmul_q{bits}"
    packed = pack(torch.from_numpy(np.ascontiguousarray(raw)), fmt.removesuffix("_edges")).numpy()
    rows = packed.reshape(raw.shape[0], -1)  # the same bytes; run() reads N from the shape
    g = np.random.default_rng(5)
    pool = (g.standard_normal((24, k)) * g.uniform(0, 4, (24, 1))).astype(np.float32)
    pool[0, :32] = 0.0  # an all-zero block (scale 0)
    rng = random.Random(f"q8-{fmt}")
    batches = [[rng.randrange(len(pool)) for _ in range(size)] for size in (1, 2, 3, 4, 5, 8, 13)]
    calls = ([(op, raw.shape[0], [i]) for i in range(len(pool))]
             + [(op, rng.choice([16, raw.shape[0]]), idx) for idx in batches])
    x = torch.from_numpy(pool)
    arm = (("neon", "avx2"), ("neondot", "avx2")) if bits == 8 else (("neon", "avx2"),)
    for isa, twin in (*arm, ("portable", "portable")):
        results = run(driver, isa, fmt.removesuffix("_edges"), rows, k, pool, calls)
        alone = np.concatenate(results[:len(pool)])
        host = matmul(x, torch.from_numpy(packed), "auto", twin).numpy()
        assert np.array_equal(alone.view(np.uint32), host.view(np.uint32)), (
            f"{isa}: {(alone != host).sum()} of {alone.size} results differ from x86 {twin}")
        for idx, got in zip(batches, results[len(pool):]):
            assert np.array_equal(got.view(np.uint32), alone[idx].view(np.uint32)), (isa, idx)


def test_the_library_sources_compile_for_aarch64(driver):
    """The rest of the C++ library (the layer loop, the ops, the matmul's run-time choice, which
    on AArch64 offers neon and portable) parses for AArch64 against the installed torch's
    headers, as library.py builds it there (ATen's DEFAULT vectors)."""
    from torch.utils import cpp_extension

    from engine.model.cpu import library

    assert library.isa_builds("aarch64") == ["portable", "neon"]
    assert library.isa_builds("x86_64") == ["portable", "avx2", "avx512"]
    assert library.isa_objects("aarch64") == ["portable", "neon", "neondot"]
    assert library.isa_objects("x86_64") == ["portable", "avx2", "avx512", "avx512vnni"]
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    jobs = [subprocess.Popen([CXX, "-fsyntax-only", "-w", "-std=c++17", "-fopenmp",
                              "-DCPU_CAPABILITY=DEFAULT", *includes, str(src)],
                             stderr=subprocess.PIPE, text=True) for src in library.SOURCES]
    for src, job in zip(library.SOURCES, jobs):
        _, err = job.communicate(timeout=300)
        assert job.returncode == 0, f"{src.name} does not compile for AArch64:\n{err[-2000:]}"
