"""`python -m benchmarks.bench --peer llama-server`: the engine beside llama.cpp's server, in one run.

A CPU user who wants to serve the bundled model would pick llama.cpp's `llama-server`, which
reads the bundled GGUF file as it ships. This bench puts the two side by side on the same CPU,
the same file, the same prompts and the same token counts:

1. `llama-server` starts as a child process on 127.0.0.1 and a free port with the bundled GGUF
   (`-m`), one slot per engine seat (`-np`, continuous batching `-cb`), each slot the engine's
   `max_model_len` of context (`-c seats * max_model_len`), and the engine's thread count
   (`-t`, `-tb`: the machine's cores). The engine starts the same way
   (`python -m engine.serve --engine-config JSON`: any `EngineConfig`, every field).
   Each waits for `/health` (bounded in time) and is stopped by its own process id.
2. Both get the same requests through OpenAI's `/v1/completions` (`benchmarks/load.py`'s client:
   streamed, greedy `temperature=0`, `ignore_eos`, `cache_prompt=false` so llama.cpp recomputes
   each prompt as the engine does without prefix caching):
   - batch-1 decode: one long answer at a time; tok/s = 1 / TPOT (time per output token after
     the first, measured at the client), the best of the turns;
   - the long-tail workload (`benchmarks/workloads.py`, all requests at once, `seats` of them
     running together): output tokens per wall second, TTFT, and output tokens per CPU second
     of the server process (`/proc/<pid>/stat`), a figure other jobs on a shared machine move
     less than the wall clock; the turn with the median output tok/s.
   The two servers take turns (`--rounds` each, the order flipping every round, a fresh start
   each turn), so a slow spell of a shared machine falls on both alike.
3. The engine offline in this process (`benchmarks.common.decode_rate` and `run_engine`, the
   same configuration): what the HTTP layer costs.

Without a `llama-server` on PATH (or `--peer-binary PATH`) it prints one line and exits 0: the
peer is optional and CI never builds it. docs/performance.md says how to install or build it.
The engine's configuration passes through (`--dtype`, `--weights`, `--engine-option KEY=VALUE`
for any `EngineConfig` field), so a new engine path can be compared with the same command.
A third side, a second `engine.serve` in the same turns, measures a change against what it
replaces: `--baseline-option KEY=VALUE` (the configuration with that field changed) and
`--baseline-checkout DIR` (the code of another checkout, say `git worktree add DIR main`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import cpu_description
from benchmarks.workloads import LONG_ANSWER, WorkItem, chat, get_workload, load_jsonl
from engine.config import DEVICES, DTYPES, WEIGHTS

PEERS = ("llama-server",)
ROOT = Path(__file__).resolve().parents[1]
# fields llama.cpp's server reads beside OpenAI's: recompute every prompt (no reuse of a
# slot's cached prefix), as the engine does without prefix caching
PEER_EXTRA_BODY = {"llama-server": {"cache_prompt": False}}


def skip_message(peer: str) -> str:
    return (f"{peer} not found on PATH: skipping the peer comparison (install or build "
            f"llama.cpp's server, docs/performance.md, or pass --peer-binary PATH)")


def find_peer_binary(peer: str, explicit: str | None = None) -> str | None:
    """The peer's executable: `explicit` (ValueError if it is not an executable file), else
    `peer` on PATH, else None."""
    if explicit:
        p = Path(explicit).expanduser()
        if not p.is_file() or not os.access(p, os.X_OK):
            raise ValueError(f"--peer-binary {explicit}: no executable file there")
        return str(p.resolve())
    return shutil.which(peer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_count() -> int:
    """The cores this process may run on (what the engine's threads use, by default)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1



def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far, all its threads (Linux /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def llama_server_command(binary: str, gguf: str, port: int, seats: int, max_model_len: int,
                         threads: int, extra: list[str] | None = None) -> list[str]:
    """llama-server's flags for the engine's setup: a slot per seat, each of max_model_len."""
    return [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
            "-c", str(seats * max_model_len), "-np", str(seats), "-cb",
            "-t", str(threads), "-tb", str(threads), *(extra or [])]


# the entry point an earlier checkout serves any EngineConfig with, before
# `engine.serve --engine-config` replaced it (a --baseline-checkout may be one of those)
OLD_SERVE_CONFIG = Path("benchmarks") / "serve_config.py"


def engine_server_command(config: dict, port: int, root: Path = ROOT) -> list[str]:
    """`engine.serve` for the EngineConfig fields in `config`, run from checkout `root`."""
    if (root / OLD_SERVE_CONFIG).is_file():
        return [sys.executable, "-m", "benchmarks.serve_config", json.dumps(config),
                "--port", str(port)]
    return [sys.executable, "-m", "engine.serve", "--engine-config", json.dumps(config),
            "--port", str(port)]


def peer_version(binary: str) -> str:
    """`llama-server --version`'s text (version and build), or why it could not be read."""
    try:
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    text = (r.stdout + r.stderr).strip()
    lines = [ln for ln in text.splitlines() if "version" in ln or "built with" in ln]
    return " / ".join(lines) if lines else text[-300:]


def system_info(log: str) -> str | None:
    """llama.cpp's `system_info:` line from its log: threads and the CPU features it uses."""
    for line in log.splitlines():
        if "system_info:" in line:
            return line.split("system_info:", 1)[1].strip()
    return None


def probe_system_info(binary: str, gguf: str, threads: int, log_path: Path,
                      env: dict[str, str] | None = None, timeout_s: float = 60.0) -> str | None:
    """llama.cpp's system info line from a short start of its own, for builds that write it
    only at trace verbosity (b11434: `common_params_print_info`, `-lv 4`); a whole serving
    run at that verbosity would log every token. The server starts with `-lv 4` on a free
    port and is stopped by its pid as soon as the line is in its log (or after timeout_s);
    None if the line never came."""
    port = free_port()
    cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-lv", "4"]
    probe = ServerProcess("system info probe", cmd, port, log_path, env)
    probe.launch()
    try:
        deadline = time.monotonic() + timeout_s
        while (info := system_info(probe.log_text())) is None:
            if probe.proc.poll() is not None or time.monotonic() > deadline:
                return system_info(probe.log_text())
            time.sleep(0.1)
        return info
    finally:
        probe.stop()


_THREADS = re.compile(r"n_threads\s*=\s*(\d+)(?:\s*\(n_threads_batch\s*=\s*(\d+)\))?"
                      r"(?:\s*/\s*(\d+))?")


def parse_system_info(info: str) -> dict:
    """llama.cpp's system info (what `system_info` returns, with or without the `system_info:`
    prefix) as fields: its threads and, per ggml backend, the features it was built with.

    llama.cpp writes `n_threads = T (n_threads_batch = B) / H | ` and then, for each backend
    that lists features, `NAME : FEAT = VALUE | FEAT = VALUE | ...` (common_params_get_system_info
    and llama_print_system_info); older builds wrote the features without a backend name. The
    JSON keeps the line too, so a format this does not know loses nothing."""
    text = info.split("system_info:", 1)[-1].strip()
    out: dict = {"n_threads": None, "n_threads_batch": None, "hardware_threads": None,
                 "backends": {}}
    fields = [f.strip() for f in text.split("|")]
    if fields and (m := _THREADS.search(fields[0])):
        out["n_threads"] = int(m.group(1))
        out["n_threads_batch"] = int(m.group(2)) if m.group(2) else None
        out["hardware_threads"] = int(m.group(3)) if m.group(3) else None
        fields = fields[1:]
    backend = "CPU"  # builds before backends named themselves listed the CPU's features only
    for f in fields:
        if "=" not in f:
            continue  # the empty field after the last "|"
        if ":" in f.split("=", 1)[0]:  # "CPU : SSE3 = 1": a backend's first feature
            name, f = f.split(":", 1)
            backend = name.strip()
        name, _, value = (p.strip() for p in f.partition("="))
        if name:
            out["backends"].setdefault(backend, {})[name] = value
    # the features it runs with: a value other than "0" (flags are "1"; SVE_CNT is a width)
    out["features"] = sorted({n for feats in out["backends"].values()
                              for n, v in feats.items() if v not in ("0", "")})
    return out


def kernel_paths(plan, peer_result: dict | None) -> dict:
    """Each side's kernel paths, for the JSON: the engine's execution plan (engine/plan.py) and
    llama.cpp's system info line with its fields (None where the peer's log had none)."""
    info = _get(peer_result, "system_info")
    return {"engine": {"describe": plan.describe(), "plan": plan.as_dict()},
            "peer": None if info is None else {"system_info": info, **parse_system_info(info)}}


@dataclass
class ServerProcess:
    """A server run as a child process: started, waited for, and stopped by its own pid."""

    name: str
    command: list[str]
    port: int
    log_path: Path
    env: dict[str, str] | None = None
    startup_timeout_s: float = 300.0
    cwd: Path = ROOT  # the checkout whose code it runs (--baseline-checkout: another one)
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until GET /health answers 200 (llama-server answers 503 while it
        loads the model); RuntimeError with its log's end if it exits or the time runs out."""
        self.launch()
        try:
            self._wait_ready(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Start it, its output going to its log (a file, not a pipe: a full pipe blocks it)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd)

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} before "
                                   f"it was ready; the end of {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.root}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} was not ready after {timeout_s:.0f} s; the "
                                   f"end of {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.25)

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else process_cpu_seconds(self.proc.pid)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to its pid, then SIGKILL if it has not exited within 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def decode_item(max_tokens: int) -> WorkItem:
    """The batch-1 request: a prompt that asks for a long answer."""
    return WorkItem(chat(LONG_ANSWER[0]), max_tokens, name="decode-b1")


def measure_server(server: ServerProcess, workload_items: list[WorkItem], decode_tokens: int,
                   rounds: int, seats: int, timeout_s: float,
                   extra_body: dict | None = None) -> dict:
    """Start `server`, warm it up, measure batch-1 decode and the workload, stop it."""
    from benchmarks.load import run_load

    def load(items: list[WorkItem]) -> dict:
        return asyncio.run(run_load(f"{server.root}/v1", items, timeout_s=timeout_s,
                                    progress=False, extra_body=extra_body))

    with server:
        # warm-up: a full batch of short answers (first calls of every kernel, thread pools)
        load([WorkItem(it.prompt, 4, name=f"warm-{i}")
              for i, it in enumerate(workload_items[:seats])])
        rates = []
        for _ in range(rounds):
            s = load([decode_item(decode_tokens)])
            if s["ok"] != 1 or not s["tpot_p50_s"]:
                raise RuntimeError(f"{server.name}: the batch-1 request failed: {s['outcomes']} "
                                   f"{s['errors']}")
            rates.append(1.0 / s["tpot_p50_s"])
        cpu0 = server.cpu_seconds()
        summary = load(workload_items)
        cpu1 = server.cpu_seconds()
        log = server.log_text()
    out = {"system": server.name, "command": server.command,
           "decode_b1": {"tok_per_s": max(rates), "rounds_tok_per_s": rates,
                         "max_tokens": decode_tokens},
           "workload": summary, "server_cpu_s": None, "tok_per_server_cpu_s": None}
    if cpu0 is not None and cpu1 is not None and cpu1 > cpu0:
        out["server_cpu_s"] = cpu1 - cpu0
        out["tok_per_server_cpu_s"] = summary["output_tokens"] / (cpu1 - cpu0)
    if info := system_info(log):
        out["system_info"] = info
    return out


B1_PER_TURN = 3  # batch-1 answers in each turn (a server's best one is its turn's figure)


def measure_in_turns(sides: list[tuple[str, Callable[[], ServerProcess], dict | None]],
                     workload_items: list[WorkItem], decode_tokens: int, rounds: int, seats: int,
                     timeout_s: float) -> dict[str, dict]:
    """Each side's server `rounds` times, in turns whose order flips every round (A B, B A,
    A B, ...), each turn a fresh start (`measure_server`: warm-up, B1_PER_TURN batch-1
    answers, the workload): a slow spell of a shared machine falls on both sides alike,
    where all of one side's runs before all of the other's let it fall on one side only. A
    server is never left idle beside the one measured: llama-server's OpenMP threads under
    ACTIVE spin while idle. `sides`: (name, a new ServerProcess, its extra body)."""
    turns: dict[str, list[dict]] = {name: [] for name, _, _ in sides}
    for r in range(rounds):
        for name, make, extra in (sides if r % 2 == 0 else sides[::-1]):
            res = measure_server(make(), workload_items, decode_tokens, rounds=B1_PER_TURN,
                                 seats=seats, timeout_s=timeout_s, extra_body=extra)
            turns[name].append(res)
            print(f"  turn {r + 1}, {name}: {res['decode_b1']['tok_per_s']:.1f} tok/s at batch "
                  f"1; {res['workload']['output_tok_per_s']:.1f} output tok/s", flush=True)
    return {name: merge_turns(ts) for name, ts in turns.items()}


def merge_turns(turns: list[dict]) -> dict:
    """One side's turns as one result: batch 1 the best turn (as one server's best round);
    the workload, its CPU seconds and its log's facts from the turn with the median output
    tok/s (the lower middle of an even count); every turn's figures under `turns`."""
    rates = [t["decode_b1"]["tok_per_s"] for t in turns]  # each turn's best answer
    mid = sorted(turns, key=lambda t: t["workload"]["output_tok_per_s"])[(len(turns) - 1) // 2]
    out = dict(mid)
    out["decode_b1"] = {**mid["decode_b1"], "tok_per_s": max(rates), "rounds_tok_per_s": rates}
    out["turns"] = [{"decode_b1_tok_per_s": t["decode_b1"]["tok_per_s"],
                     "output_tok_per_s": t["workload"]["output_tok_per_s"],
                     "server_cpu_s": t["server_cpu_s"]} for t in turns]
    info = next((t["system_info"] for t in turns if "system_info" in t), None)
    if info is not None:
        out["system_info"] = info
    return out


def pool_runs(paths: list[str]) -> dict:
    """The turns of several runs' JSONs (written by this bench) as one sample: each side's
    median batch-1 rate (a turn's best answer) and median workload rate over all its turns,
    the ratios of those medians, and the range of the turn-by-turn ratios (a run's turn i of
    the engine against its turn i of the peer). A run's own figures take the best batch-1
    turn and the median workload turn of 2-3 turns; on a noisy VM many runs' turns pooled say
    more than any one run. ValueError naming a file that is not such a JSON."""
    import statistics

    sides = {"engine_http": ([], []), "peer_http": ([], [])}
    pairs: list[float] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            res = data["results"]
            turns = {k: res[k]["turns"] for k in sides}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a peer bench JSON with both sides' turns "
                             f"({type(exc).__name__}: {exc})") from None
        for k, (b1, wl) in sides.items():
            b1 += [t["decode_b1_tok_per_s"] for t in turns[k]]
            wl += [t["output_tok_per_s"] for t in turns[k]]
        pairs += [e["output_tok_per_s"] / p["output_tok_per_s"]
                  for e, p in zip(turns["engine_http"], turns["peer_http"])]
    if not pairs:
        raise ValueError(f"{', '.join(paths)}: no turns of both sides to pool")
    med = {k: (statistics.median(b1), statistics.median(wl)) for k, (b1, wl) in sides.items()}
    (eb, ew), (pb, pw) = med["engine_http"], med["peer_http"]
    return {"runs": len(paths), "turns": len(sides["engine_http"][1]),
            "engine_http": {"decode_b1_tok_per_s": eb, "output_tok_per_s": ew},
            "peer_http": {"decode_b1_tok_per_s": pb, "output_tok_per_s": pw},
            "decode_b1_engine_over_peer": eb / pb, "output_tok_per_s_engine_over_peer": ew / pw,
            "turn_ratios": [min(pairs), max(pairs)]}


def measure_offline(config_dict: dict, workload, decode_tokens: int, threads: int) -> dict:
    """The same engine configuration in this process: batch-1 decode and the workload."""
    import torch

    from benchmarks.common import decode_rate, run_engine
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    torch.set_num_threads(threads)
    config = EngineConfig.from_json(config_dict)
    engine = LLMEngine(config)
    steps = max(4, decode_tokens // 3)
    rate = decode_rate(engine, 1, steps=steps, windows=3)
    describe = engine.describe()
    del engine
    cpu0 = time.process_time()
    res = run_engine(config, workload)
    cpu = time.process_time() - cpu0
    return {"system": "engine offline", "describe": describe,
            "decode_b1": {"tok_per_s": rate, "steps": steps},
            "workload": res, "cpu_s": cpu, "tok_per_cpu_s": res["output_tokens"] / cpu}


# ---------------------------------------------------------------------------------------------
# The side-by-side table


def _get(r: dict | None, *path):
    for k in path:
        if r is None:
            return None
        r = r.get(k)
    return r


def comparison(engine_http: dict | None, peer: dict | None, offline: dict | None,
               peer_name: str = "llama-server") -> tuple[list[list[str]], dict]:
    """The table's rows (strings) and the ratios (engine / peer) as numbers.

    Each result is what `measure_server` or `measure_offline` returns; a missing one (None)
    leaves its column as '-'. Ratios: engine over HTTP / peer, and engine offline / peer."""
    metrics = [  # (ratio key, row label, path in an HTTP result, path in the offline result)
        ("decode_b1", "batch-1 decode, tok/s", ("decode_b1", "tok_per_s"),
         ("decode_b1", "tok_per_s")),
        ("output_tok_per_s", "workload: output tok/s", ("workload", "output_tok_per_s"),
         ("workload", "output_tok_per_s")),
        ("ttft_p50", "workload: TTFT p50, s", ("workload", "ttft_p50_s"),
         ("workload", "ttft_p50_s")),
        ("tok_per_cpu_s", "workload: output tok per CPU s", ("tok_per_server_cpu_s",),
         ("tok_per_cpu_s",)),
    ]
    head = ["", "engine.serve", peer_name, "ratio", "engine offline", "ratio"]
    rows = [head]
    ratios: dict[str, float | None] = {}

    def cell(v) -> str:
        if v is None:
            return "-"
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"

    def ratio(a, b) -> float | None:
        return a / b if a is not None and b else None

    for key, label, http_path, off_path in metrics:
        e, p, o = _get(engine_http, *http_path), _get(peer, *http_path), _get(offline, *off_path)
        r_http, r_off = ratio(e, p), ratio(o, p)
        ratios[f"{key}_engine_over_peer"] = r_http
        ratios[f"{key}_offline_over_peer"] = r_off
        rows.append([label, cell(e), cell(p), "-" if r_http is None else f"{r_http:.2f}x",
                     cell(o), "-" if r_off is None else f"{r_off:.2f}x"])
    exact = []
    for r in (engine_http, peer):
        s = _get(r, "workload")
        exact.append("-" if s is None else f"{s['exact_tokens']}/{s['users']}")
    off = _get(offline, "workload", "output_tokens")
    rows.append(["workload: requests with the exact tokens asked", exact[0], exact[1], "",
                 "-" if off is None else f"{off} tok", ""])
    return rows, ratios


BASELINE = "engine.serve baseline"  # the side --baseline-option adds


def baseline_ratios(engine_http: dict, base_http: dict, peer: dict) -> dict:
    """engine / baseline and baseline / peer, at batch 1 and on the workload."""
    out = {}
    for key, path in (("decode_b1", ("decode_b1", "tok_per_s")),
                      ("output_tok_per_s", ("workload", "output_tok_per_s"))):
        e, b, p = _get(engine_http, *path), _get(base_http, *path), _get(peer, *path)
        out[f"{key}_engine_over_baseline"] = e / b if e is not None and b else None
        out[f"{key}_baseline_over_peer"] = b / p if b is not None and p else None
    return out


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)


# ---------------------------------------------------------------------------------------------
# The command


def engine_config_dict(args: argparse.Namespace) -> dict:
    """The engine's EngineConfig fields from the flags (validated by the server it starts)."""
    cfg = {"model": "smollm2-135m", "batching": "continuous", "kv_layout": "paged",
           "max_num_seqs": args.seats, "max_model_len": args.max_model_len,
           "block_size": args.block_size, "max_num_batched_tokens": max(512, args.seats),
           "device": args.device, "dtype": args.dtype}
    if args.weights is not None:
        cfg["weights"] = args.weights
    return with_options(cfg, args.engine_option, "--engine-option")


def with_options(cfg: dict, options: list[str], flag: str) -> dict:
    """cfg with each KEY=VALUE of `options` set (VALUE as JSON, or a bare string)."""
    cfg = dict(cfg)
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {opt!r}: expected KEY=VALUE")
        try:
            cfg[key] = json.loads(value)
        except json.JSONDecodeError:
            cfg[key] = value  # a bare word: a string
    return cfg


def serves_engine_config(root: Path) -> bool:
    """Does checkout `root` have `python -m engine.serve --engine-config`?"""
    serve = root / "engine" / "serve.py"
    config = root / "engine" / "config.py"
    return (serve.is_file() and config.is_file()
            and '"--engine-config"' in config.read_text(errors="replace"))


def baseline_checkout(path: str | None) -> dict | None:
    """--baseline-checkout's directory, its commit and whether it has changes beside it;
    ValueError when it is not a checkout of this repository."""
    if path is None:
        return None
    root = Path(path).expanduser().resolve()
    if not (serves_engine_config(root) or (root / OLD_SERVE_CONFIG).is_file()):
        raise ValueError(f"--baseline-checkout {path}: no engine/serve.py with "
                         "--engine-config there (nor an earlier checkout's "
                         f"{OLD_SERVE_CONFIG}): a checkout of this repository, e.g. "
                         "`git worktree add DIR REV`")

    def git(*cmd: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True,
                               timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain")
    return {"path": str(root), "commit": git("rev-parse", "HEAD") or "unknown (not a git checkout)",
            "dirty": None if status is None else bool(status)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench --peer llama-server",
                                 description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--peer", default="llama-server", choices=PEERS)
    a("--peer-binary", default=None, help="the peer's executable (default: llama-server on PATH)")
    a("--peer-arg", action="append", default=[],
      help="one more argument for the peer's command line (repeat the flag for more)")
    a("--model-file", default=None, help="the GGUF file for the peer (default: the bundled one)")
    a("--workload", default="longtail")
    a("--workload-file", default=None, help="JSONL lines {\"prompt\": ..., \"max_tokens\": ...}")
    a("--requests", type=int, default=32)
    a("--seats", type=int, default=16, help="engine max_num_seqs = llama-server slots (-np)")
    a("--max-model-len", type=int, default=512, help="per request = llama-server -c / -np")
    a("--block-size", type=int, default=16)
    a("--decode-tokens", type=int, default=128, help="output tokens of the batch-1 request")
    a("--rounds", type=int, default=3,
      help="turns of each server, alternating (batch 1: the best; the workload: the median)")
    a("--threads", type=int, default=None, help="both servers' threads (default: the cores)")
    a("--dtype", default="auto", choices=DTYPES)
    a("--device", default="cpu", choices=DEVICES,
      help="the peer runs on the CPU, so the engine does too")
    a("--weights", default=None, choices=WEIGHTS,
      help="EngineConfig(weights=...) (default: the engine's)")
    a("--engine-option", action="append", default=[], metavar="KEY=VALUE",
      help="any EngineConfig field (VALUE as JSON, or a bare string); repeatable")
    a("--baseline-option", action="append", default=[], metavar="KEY=VALUE",
      help="a second engine.serve in the turns, the engine's configuration with this field "
           "changed (repeatable): a change measured against what it replaces in one run")
    a("--baseline-checkout", default=None, metavar="DIR",
      help="a second engine.serve in the turns, run from another checkout of this repository "
           "(say `git worktree add DIR REV`), with the engine's configuration and any "
           "--baseline-option: a code change measured against what it replaces in one run")
    a("--pool", nargs="+", metavar="JSON",
      help="measure nothing: pool the turns of these runs' JSONs and print the medians' ratios")
    a("--skip-engine", action="store_true", help="measure the peer alone (no engine.serve)")
    a("--skip-offline", action="store_true", help="no offline engine run in this process")
    a("--quick", action="store_true",
      help="8 short requests, 32-token batch-1 answers, at most 2 turns")
    a("--startup-timeout", type=float, default=300.0, help="seconds to wait for /health")
    a("--timeout", type=float, default=1800.0, help="seconds for one phase's requests")
    a("--log-dir", default="build/peer-logs", help="the servers' logs")
    a("--out", "--json", dest="out", default="build/peer-llama-server.json",
      help="write the results here (JSON)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.pool:
        try:
            pooled = pool_runs(args.pool)
        except ValueError as exc:
            ap.error(str(exc))
        e, p = pooled["engine_http"], pooled["peer_http"]
        print(f"{pooled['runs']} runs, {pooled['turns']} turns a side; medians over the turns: "
              f"batch 1 {e['decode_b1_tok_per_s']:.1f} / {p['decode_b1_tok_per_s']:.1f} tok/s = "
              f"{pooled['decode_b1_engine_over_peer']:.2f}x, workload "
              f"{e['output_tok_per_s']:.1f} / {p['output_tok_per_s']:.1f} output tok/s = "
              f"{pooled['output_tok_per_s_engine_over_peer']:.2f}x (engine / {args.peer}); "
              f"turn by turn {pooled['turn_ratios'][0]:.2f}x-{pooled['turn_ratios'][1]:.2f}x")
        return 0
    try:
        binary = find_peer_binary(args.peer, args.peer_binary)
    except ValueError as exc:
        ap.error(str(exc))
    if binary is None:
        print(skip_message(args.peer))
        return 0
    for name in ("requests", "seats", "max_model_len", "block_size", "decode_tokens", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be >= 1")
    threads = args.threads or cpu_count()
    if args.quick:
        args.requests, args.decode_tokens = min(args.requests, 8), 32
        args.rounds = min(args.rounds, 2)
    try:
        config = engine_config_dict(args)
        checkout = baseline_checkout(args.baseline_checkout)
        baseline = (with_options(config, args.baseline_option, "--baseline-option")
                    if args.baseline_option or checkout else None)
        from engine.config import EngineConfig

        # a bad option fails here, not in the child (another checkout's server checks its own
        # fields: it may know one this one does not)
        for c in (config, baseline if baseline and not checkout else config):
            EngineConfig.from_json(c)
        wl = load_jsonl(args.workload_file) if args.workload_file else get_workload(
            args.workload, n=args.requests, max_tokens_scale=0.25 if args.quick else 1.0)
    except (ValueError, TypeError, OSError) as exc:
        ap.error(str(exc))
    if args.decode_tokens + 64 > args.max_model_len:
        ap.error(f"--decode-tokens {args.decode_tokens} leaves no room for the prompt in "
                 f"--max-model-len {args.max_model_len}")
    if args.model_file:
        gguf = Path(args.model_file).expanduser()
        if not gguf.is_file():
            ap.error(f"--model-file {args.model_file}: no such file")
    else:
        from engine.model.loader import BUNDLED_MODELS, _bundled_gguf

        gguf = _bundled_gguf(config["model"]) if config["model"] in BUNDLED_MODELS else None
        if gguf is None:
            ap.error("--model-file is needed when the engine's model is not a bundled one")

    version = peer_version(binary)
    print(f"{args.peer}: {binary} ({version}); {gguf.name}; {threads} threads; "
          f"{len(wl)} {wl.name} requests, {args.seats} seats")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log_dir = Path(args.log_dir)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    from engine.threads import server_env

    def engine_server(cfg: dict = config, name: str = "engine.serve",
                      root: Path = ROOT) -> ServerProcess:
        port = free_port()
        child_env = server_env(env)
        if root != ROOT:  # its own packages first, whatever this one has installed
            child_env["PYTHONPATH"] = os.pathsep.join(
                [str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
        return ServerProcess(name, engine_server_command(cfg, port, root), port,
                             log_dir / f"{name.replace(' ', '-')}.log", child_env,
                             args.startup_timeout, cwd=root)

    # llama.cpp's threads (OpenMP too) under the bench's policy without the engine's spin
    # count: ACTIVE alone was at least as fast for it at batch 1 (docs/performance.md)
    peer_env = {k: v for k, v in env.items() if k != "GOMP_SPINCOUNT"}

    def peer_server() -> ServerProcess:
        port = free_port()
        cmd = llama_server_command(binary, str(gguf), port, args.seats, args.max_model_len,
                                   threads, args.peer_arg)
        return ServerProcess(args.peer, cmd, port, log_dir / f"{args.peer}.log", peer_env,
                             args.startup_timeout)

    # the peer's own fields (llama-server's cache_prompt) are for the peer alone: the engine
    # refuses a field it does not know, as it must
    sides = ([] if args.skip_engine else [("engine.serve", engine_server, None)]) + [
        (args.peer, peer_server, PEER_EXTRA_BODY.get(args.peer))]
    if baseline is not None and not args.skip_engine:
        base_root = Path(checkout["path"]) if checkout else ROOT
        sides.append((BASELINE, lambda: engine_server(baseline, BASELINE, base_root), None))
    print(f"{args.rounds} turns of each server (a fresh start, {B1_PER_TURN} batch-1 answers, "
          f"the workload), "
          f"in alternating order ...", flush=True)
    results = measure_in_turns(sides, wl.items, args.decode_tokens, args.rounds, args.seats,
                               args.timeout)
    engine_http, peer = results.get("engine.serve"), results[args.peer]
    peer["version"] = version
    if "system_info" not in peer and args.peer == "llama-server":
        info = probe_system_info(binary, str(gguf), threads, log_dir / "system-info-probe.log",
                                 peer_env)
        if info is not None:
            peer["system_info"], peer["system_info_from"] = info, "a start with -lv 4"

    offline = None
    if not args.skip_offline:
        print("engine offline (this process): batch-1 decode, then the workload ...", flush=True)
        offline = measure_offline(config, wl, args.decode_tokens, threads)
    load_after = os.getloadavg()

    rows, ratios = comparison(engine_http, peer, offline, args.peer)
    print(f"\n{len(wl)} {wl.name} requests, {args.seats} running at most; batch-1 answers of "
          f"{args.decode_tokens} tokens; ratio = engine / {args.peer}")
    print(format_table(rows))
    base_http = results.get(BASELINE)
    if base_http is not None:
        ratios.update(baseline_ratios(engine_http, base_http, peer))
        changed = {k: baseline[k] for k in baseline if baseline[k] != config.get(k)}
        if checkout:
            commit = checkout["commit"]
            changed["checkout"] = f"{checkout['path']} ({commit[:10] if len(commit) == 40 else commit})"
        def x(r: float | None) -> str:
            return "-" if r is None else f"{r:.2f}x"

        print(f"{BASELINE} ({json.dumps(changed)}): batch 1 "
              f"{base_http['decode_b1']['tok_per_s']:.1f} tok/s, workload "
              f"{base_http['workload']['output_tok_per_s']:.1f} output tok/s; engine.serve / "
              f"baseline {x(ratios['decode_b1_engine_over_baseline'])} at batch 1, "
              f"{x(ratios['output_tok_per_s_engine_over_baseline'])} on the workload")
    cpu = cpu_description()
    print(f"CPU: {cpu['model']} ({', '.join(cpu['flags'])}); load average (1 min) before / "
          f"after: {load_before[0]:.2f} / {load_after[0]:.2f}")

    from benchmarks.common import write_json
    from engine.plan import plan_for

    plan = plan_for(EngineConfig.from_json(config))
    write_json(args.out, "cpu", args, plan=plan,
               peer={"name": args.peer, "binary": binary, "version": version, "gguf": str(gguf)},
               kernel_paths=kernel_paths(plan, peer),
               cpu=cpu, engine_config=config, baseline_config=baseline,
               baseline_checkout=checkout, threads=threads,
               workload=wl.name,
               load_average={"before": load_before, "after": load_after},
               elapsed_s=time.perf_counter() - t0,
               results={"engine_http": engine_http, "peer_http": peer,
                        "engine_offline": offline, "baseline_http": base_http},
               ratios=ratios, table=rows)
    ok = all(r["workload"]["ok"] == r["workload"]["users"]
             for r in (engine_http, peer, base_http) if r is not None)
    return 0 if ok else 1


if __name__ == "__main__":
    from benchmarks.common import spin_openmp_threads

    spin_openmp_threads("benchmarks.peer")
    sys.exit(main())
