"""Shared fixtures, reachable from every folder under tests/: the bundled model loads once per
test session (fp32, CPU), and a real uvicorn server on 127.0.0.1 and a free port, started and
stopped by the test.

`running_server(engine, settings)` runs the FastAPI app in a thread of the test process (so
a test may also look at the engine, through the loop's `call`) and stops it on exit. The
server tests' engines are small (fp32, few seats, short model length) so tests/engine/server/
runs in well under two minutes on two cores.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import threading
import time

import pytest

from benchmarks.workloads import PROBE_PROMPTS as PROMPTS  # noqa: F401  (tests import it from here)


def pytest_configure(config):
    """An xdist worker (make test runs two) takes its share of the cores for torch's threads
    and its children's: two workers of two threads each on two cores would spin in each
    other's OpenMP barriers."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    _scan_streamlit_manifests_once()


def _scan_streamlit_manifests_once():
    """Every AppTest scans all installed packages for streamlit "v2" component manifests
    (importlib.metadata over the whole venv, on a thread pool), once per AppTest: ~0.4 s alone,
    and many times that late in a full run. The installed packages do not change during a test
    session, so scan once and hand the same list to every AppTest (the app has no v2
    components; the same manifests are registered either way)."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # another streamlit: nothing to cache
        return
    scan = manifest_scanner.scan_component_manifests
    if not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.lru_cache(maxsize=1)(scan)


def pytest_runtest_logreport(report):
    """With SERVELAB_TIMELOG=PATH, each test phase's seconds are appended to PATH as it ends,
    with the worker that ran it and the clock (a long run can be read while it goes, and the
    workers' timelines drawn; the JUnit XML is written only at the end)."""
    path = os.environ.get("SERVELAB_TIMELOG")
    if path and getattr(report, "node", None) is None:  # (xdist's controller: a worker's copy)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{report.duration:8.2f} {report.when:8s} {report.outcome:7s} "
                    f"{report.nodeid} {os.environ.get('PYTEST_XDIST_WORKER', '-')} "
                    f"{time.time():.1f}\n")


def require(present: bool, missing: str) -> None:
    """A system tool a test needs (`missing` says what to install): skip without it on a
    developer's machine, fail under CI (CI set), whose .ci/run installs every such tool, so a
    broken install cannot pass green. Python packages are never skipped: `make test`
    installs them all, and a missing one fails at its import."""
    if present:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{missing} (.ci/run installs it: CI must run this test)")
    pytest.skip(missing)


@pytest.hookimpl(trylast=True)  # after xdist's own hook: see _in_group
def pytest_collection_modifyitems(config, items):
    """The browser tests run last, in their order: the session's chromium (playwright's sync
    API, `chromium` below) holds an event loop on the main thread while it is open, and
    `asyncio.run` refuses to start under it (tests/browsing.py).

    Under pytest-xdist (make test: `-n 2 --dist loadgroup --no-loadscope-reorder`) each test
    gets a group, the unit one worker runs in order: its module (whose fixtures, a server or
    an engine, start once) or, for the Triton interpreter's modules, all of them together (one
    child process, tests/kernels/conftest.py). A worker takes the next group as it runs out of
    work, so the groups go out longest first (tests/durations.json, written by
    `python tests/slowest.py build/junit.xml --modules tests/durations.json`) and the two
    workers finish together; the browser groups come after every other, so a worker that
    opened chromium is never handed anything but browser tests. A test marked with its own
    xdist_group keeps it."""
    def is_browser(item) -> bool:
        return item.get_closest_marker("browser") is not None

    # an xdist worker runs with dist "no" and loadgroup set; the controller, with dist
    if not (getattr(config.option, "loadgroup", False)
            or config.getoption("dist", "no") == "loadgroup"):
        items.sort(key=is_browser)
        return
    seconds = _module_seconds()
    groups: dict[str, list] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is not None:
            group = marker.kwargs.get("name", marker.args[0] if marker.args else "")
        elif item.path.parent.name == "kernels" and not is_browser(item):
            group = "triton-interpreter"
        else:
            group = item.nodeid.split("::")[0]
        if marker is None:
            item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)

    def cost(members) -> float:
        modules = {str(m.path.relative_to(config.rootpath)) for m in members}
        return sum(seconds.get(m, 1.0) for m in modules)

    ordered = sorted(groups.values(), key=lambda m: (is_browser(m[0]), -cost(m)))
    items[:] = [item for members in ordered for item in members]
    for item in items:
        _in_group(item)


def _in_group(item) -> None:
    """Give the item's node id the "@group" suffix that xdist's loadgroup scheduler reads.

    xdist's worker hook writes it to `item._nodeid`, which pytest 9 no longer reads (a node's
    id is the structured `item._id`): there the suffix never reached the scheduler, every test
    went to whichever worker was free, and each worker built the module fixtures and started
    the Triton interpreter's child for itself. Written here to whichever attribute this pytest
    reads; an id that already has it (xdist's hook on pytest 8) is left alone."""
    names = sorted({str(m.kwargs.get("name", m.args[0] if m.args else "default"))
                    for m in item.iter_markers("xdist_group")})
    if not names:
        return
    suffix = "@" + "_".join(names)
    if item.nodeid.endswith(suffix):
        return
    node_id = getattr(item, "_id", None)
    if node_id is not None and hasattr(type(node_id), "parse"):
        item._id = type(node_id).parse(item.nodeid + suffix)
    else:
        item._nodeid = item.nodeid + suffix


def _module_seconds() -> dict[str, float]:
    import json
    import pathlib

    path = pathlib.Path(__file__).with_name("durations.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


@pytest.fixture(scope="session")
def chromium():
    """One headless chromium for every browser test of the run (each test opens its own
    contexts and closes them)."""
    from playwright.sync_api import sync_playwright

    from tests.browsing import launch, require_chromium

    require_chromium()
    with sync_playwright() as pw:
        b = launch(pw)
        yield b
        b.close()


@pytest.fixture(scope="session")
def tokenizer():
    from engine.model.loader import hf_folder, load_tokenizer

    return load_tokenizer(hf_folder("smollm2-135m"))


@functools.lru_cache(maxsize=64)
def _reference(ids: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    from benchmarks.baseline import reference_greedy

    (out,) = reference_greedy([list(ids)], max_new_tokens, ignore_eos=True)
    return tuple(out)


@pytest.fixture(scope="session")
def hf_greedy():
    """transformers' generate(), greedy, fp32, one prompt at a time, never stopping at EOS."""
    return lambda ids, n: list(_reference(tuple(ids), n))


def assert_blocks_consistent(alloc, holders) -> None:
    """Every block is free or in exactly the tables that hold it (ref counts agree for the
    paged allocator, one owner for the contiguous one); nothing leaked."""
    from engine.kv import PagedAllocator

    seen: dict[int, int] = {}
    for h in holders:
        assert len(set(h.block_table)) == len(h.block_table), "a block twice in one table"
        for b in h.block_table:
            seen[b] = seen.get(b, 0) + 1
    if isinstance(alloc, PagedAllocator):
        for b in range(alloc.num_blocks):
            assert alloc.ref_count[b] == seen.get(b, 0), f"block {b}: ref count wrong"
    else:
        assert all(c == 1 for c in seen.values()), "a block owned twice"
    assert alloc.num_free_blocks + len(seen) == alloc.num_blocks, "blocks leaked"


def teacher_forced_logits(eng, ids: list[int]):
    """benchmarks.common's (imported here when called: conftest loads no torch)."""
    from benchmarks.common import teacher_forced_logits as logits

    return logits(eng, ids)


def q4_1_edge_blocks():
    """Synthetic Q4_1 rows (8 rows of K = 256) whose scales and minimums are fp16 edge values
    (zero, subnormals, negative, the largest), every q, and gguf-py's fp32 weights for them."""
    import gguf
    import numpy as np

    g = np.random.default_rng(0)
    halves = np.array([0x0000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0x8001,
                       0x1234, 0xabcd], dtype=np.uint16)
    blocks = np.zeros((64, 20), dtype=np.uint8)
    blocks[:, 0:2] = g.choice(halves, 64).view(np.uint8).reshape(64, 2)
    blocks[:, 2:4] = g.choice(halves, 64).view(np.uint8).reshape(64, 2)
    blocks[:, 4:] = g.integers(0, 256, (64, 16), dtype=np.uint8)
    raw = blocks.reshape(8, 8 * 20)
    return raw, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).astype(np.float32)


# The integer-activation matmuls' paths (weights="gguf-q8", "gguf-q16"): (instruction set, VNNI
# allowed). "avx512" without VNNI is the AVX-512 BW path of CPUs that lack it (Skylake-X); with
# it, the default on Ice Lake, Sapphire Rapids, Zen 4 and later
INTEGER_PATHS = [("avx512", True), ("avx512", False), ("avx2", False), ("portable", False)]


@pytest.fixture(params=INTEGER_PATHS, ids=lambda p: p[0] + ("-vnni" if p[1] else ""))
def integer_path(request):
    """Each integer-kernel path this CPU can run, named as the plan names it ("avx512+vnni",
    with "+amx" where the int16 kernel has AMX int8 tiles here; the others skip, saying so)."""
    import torch

    from engine.model.cpu import library

    assert library.load(), "the C++ CPU kernels did not build (see the message above)"
    isa, vnni = request.param
    if isa not in library.isa_builds() or not torch.ops.servelab.isa_supported(isa):
        pytest.skip(f"this CPU has no {isa} (the other paths run here)")
    if vnni and not library.has_vnni():
        pytest.skip("this CPU has no AVX-512 VNNI (the AVX-512 path without it runs here)")
    if vnni:
        isa += "+vnni" + ("+amx" if torch.ops.servelab.isa_supported("amx") else "")
    return isa


@pytest.fixture(scope="session")
def gguf_rows():
    """Real rows of the bundled file (a Q4_1 layer's first 256 columns, 256 rows of the Q8_0
    embedding), and Q4_1 edge blocks (subnormal and extreme scales), with gguf-py's fp32
    values of each: fmt -> (uint8 rows, fp32 weights)."""
    import gguf
    import numpy as np
    import torch
    from gguf import GGUFReader

    from engine.model.loader import _bundled_gguf

    tensors = {t.name: t for t in GGUFReader(str(_bundled_gguf("smollm2-135m"))).tensors}
    out = {}
    for fmt, name in (("q4_1", "blk.5.ffn_down.weight"), ("q8_0", "token_embd.weight")):
        t = tensors[name]
        raw = np.array(t.data[:256])
        out[fmt] = (torch.from_numpy(raw),
                    torch.from_numpy(gguf.quants.dequantize(raw, t.tensor_type)))
    edge, edge_w = q4_1_edge_blocks()  # 8 columns of K = 256: twice, for a group of 16
    out["q4_1-edge"] = (torch.from_numpy(np.concatenate([edge, edge[::-1]])),
                        torch.from_numpy(np.concatenate([edge_w, edge_w[::-1]])))
    return out


def block_inputs(m: int, k: int, seed: int):
    """Activations [m, k] of varied size per row, the first block of row 0 all zero (scale 0)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4
    x[0, :32] = 0.0
    return x


def reference_grouped_pack(rows, fmt: str, width: int):
    """pack_q8's (width 4) and pack_q16's (width 2) documented layout, built from the GGUF rows
    with numpy: per group of 16 columns and block, the 16 d, Q4_1's 16 m, then chunks of
    16 * width q bytes, bytes width * c .. width * c + width - 1 of chunk h being column c's
    q bytes width * h on."""
    import numpy as np
    import torch

    bb, qoff = (20, 4) if fmt == "q4_1" else (34, 2)
    n, nb = rows.shape[0], rows.shape[1] // bb
    blocks = rows.numpy().reshape(n // 16, 16, nb, bb).transpose(0, 2, 1, 3)  # [g, b, c, bb]
    parts = [blocks[..., 0:2].reshape(n // 16, nb, 32)]                      # d of 16 columns
    if fmt == "q4_1":
        parts.append(blocks[..., 2:4].reshape(n // 16, nb, 32))             # m of 16 columns
    q = blocks[..., qoff:].reshape(n // 16, nb, 16, -1, width).transpose(0, 1, 3, 2, 4)
    parts.append(q.reshape(n // 16, nb, -1))
    out = np.concatenate(parts, axis=-1)
    assert out.shape[-1] == 16 * bb
    return torch.from_numpy(np.ascontiguousarray(out.reshape(n // 16, -1)))


# the configuration every server test shares, and `LLMEngine.generate` is compared against
SMALL = dict(dtype="float32", max_num_seqs=8, max_model_len=256, block_size=16,
             max_num_batched_tokens=256)


# three or more English words in a row: an English sentence, on a page or a phone that reads
# Chinese (names like KV, TTFT or ServeLab stand alone)
ENGLISH_RUN = re.compile(r"[A-Za-z][A-Za-z'’-]*(?:[ ,:;]+[A-Za-z][A-Za-z'’-]*){2,}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_process(proc, grace: float = 30.0) -> None:
    """Stop a server a test started, by its own process: SIGTERM, then SIGKILL after `grace`
    seconds; waits for it to be gone."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@contextlib.contextmanager
def running_server(engine, settings=None, start_timeout: float = 30.0, routers=None,
                   **server_kw):
    """The app over `engine` on a free 127.0.0.1 port, in a thread. `routers`: what
    `create_app` mounts besides the server's own (default: the classroom's, as the class
    server `python -m classroom.serve` does)."""
    from engine.server import create_app
    from engine.server.http import make_server

    if routers is None:
        from classroom.server import routers as class_routers

        routers = class_routers()
    app = create_app(engine, settings, routers=routers)
    port = free_port()
    server = make_server(app, "127.0.0.1", port, **server_kw)  # what engine.serve runs
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the test server did not stop"
        # a stopped server leaves its engine empty: the next server on it starts clean
        eng = app.state.loop.engine
        assert not eng.requests and not eng.groups, list(eng.requests)


@pytest.fixture(scope="session")
def engine():
    """One small engine for the servers (one at a time; each leaves it empty)."""
    from engine import EngineConfig, LLMEngine

    return LLMEngine(EngineConfig(**SMALL))


@pytest.fixture(scope="session")
def server(engine):
    """A server with the default limits, shared by the tests that need nothing special."""
    with running_server(engine) as (url, app):
        yield url, app


def in_loop(app, fn, timeout: float = 30.0):
    """fn(engine) run on the server's stepping thread (the only one that may touch it)."""
    return app.state.loop.call(fn).result(timeout)


def write_tiny_qwen2(out):
    """A tiny random Qwen2 (2 layers, hidden 64, random q/k/v biases so a loader that dropped
    them would differ, tied embeddings) saved by transformers into `out`, with the bundled
    model's tokenizer (the vocabulary it speaks). Returns the transformers model."""
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.model.loader import hf_folder

    smol = hf_folder("smollm2-135m")
    cfg = Qwen2Config(vocab_size=49152, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, rope_theta=1_000_000.0,
                      tie_word_embeddings=True, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smol / name, out / name)
    return model


def computed_prompt(alloc, rid: str, prompt: list[int]):
    """A request admitted to the paged allocator `alloc` with its whole prompt computed (its
    full blocks hashed into the prefix cache)."""
    from engine.config import SamplingParams
    from engine.request import Request

    req = Request(rid, prompt, SamplingParams(max_tokens=1))
    alloc.admit(req)
    assert alloc.ensure_slots(req, len(prompt))
    req.num_computed_tokens = len(prompt)
    alloc.on_computed(req)
    return req
