"""The teacher's side of a class: the class server's process, its step stream, the simulated
users, and the measured table of configurations. No streamlit here; the app's page
(`app/pages/classroom.py`) draws what these objects hold.

Chapter 6.4's "one server serving a thousand people" with the class as the people: one
`python -m classroom.serve` process (one engine, one stepping loop) that every student's phone
and the simulated users share, while the projector draws its step stream.

- `ClassServer`: starts `python -m classroom.serve` as a child process with the class switches
  (its own process id; `stop()` and interpreter exit end it), or adopts one already running
  whose URL and keys come from server-side configuration only (`SERVELAB_CLASS_URL`,
  `SERVELAB_CLASS_JOIN_CODE`, `SERVELAB_CLASS_ADMIN_KEY`, or the same names in the app's
  `.streamlit/secrets.toml`, which the app hands to `configured_server`), never from a text
  box.
- `StepStream`: a thread that reads `GET /v1/servelab/steps` (server-sent events) and keeps
  the newest report and a short, slimmed history for the gauges.
- `ClassRoom`: the app process's one class (server, stream, load run, results table) and
  its switch flips: the engine is swapped inside the running server
  (`POST /v1/servelab/engine`), so the class keeps its address, join code and QR code; the
  step stream's restart events and `GET /v1/servelab/engine` say how far the swap is.
- `LoadRun`: `python -m benchmarks.load` as a child process, its progress read off its progress
  bar, its JSON summary read at the end.

The join code is the server's API key (students type it, or the QR code carries it in the
URL fragment); the admin key, known only to this process, guards the step stream, so a
student with the join code cannot read the others' answers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from engine.config import SWITCHES, SpecConfig
from engine.waits import count_codes

# the folder that holds these packages (a checkout, or site-packages once installed): the
# child processes import the same ones
IMPORT_ROOT = Path(__file__).resolve().parents[1]
# besides the three switches (their values: `engine.config.SWITCHES`), the spec switch's
# refinements (as in the sidebar): k, tokens drafted per step (at most, with adaptive k);
# choose k each step; and prompt lookup in front of a draft model (draft / eagle only)
DEFAULT_SWITCHES = {"batching": "continuous", "kv_layout": "paged", "spec": "off",
                    "k": SpecConfig().num_speculative_tokens, "adaptive_k": False,
                    "lookup_first": False}
HISTORY = 600  # steps the gauges' history keeps (every step: the stream loses none)
# the class's KV pool: sized so that a class of thirty, sixteen seated at a time with short
# answers, fills most of it (a pool sized for max_model_len on every seat would stay nearly
# empty); the teacher's knob changes it
DEFAULT_KV_BLOCKS = 192
DRAIN_S = 60.0  # the bound on "finish the answers in flight" before a switch flip cuts them
# a starting class server silent this long (nothing new in its log: no download moving, no
# line from the engine's start) is given up; one that writes waits as long as it writes
START_QUIET_S = 180.0
ARRIVALS = ("poisson", "rate", "all-at-once")
_LIVE: weakref.WeakSet = weakref.WeakSet()  # processes to end at interpreter exit


def lan_address() -> str | None:
    """This machine's address on the network its default route uses (no packet is sent: a
    UDP socket's connect only picks the outgoing interface), or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def join_url(base_url: str, join_code: str | None) -> str:
    """What the QR code opens: the students' page, the join code in the URL fragment (a
    fragment stays in the browser: it is never sent to the server nor logged)."""
    url = base_url.rstrip("/") + "/class"
    return f"{url}#code={join_code}" if join_code else url


def qr_svg(text: str, scale: int = 6) -> str:
    """The QR code of `text` as inline SVG (segno)."""
    import io

    import segno

    buf = io.BytesIO()
    segno.make(text, error="m").save(buf, kind="svg", scale=scale, xmldecl=False,
                                     dark="#000", light="#fff")
    return buf.getvalue().decode()


def spec_of(switches: dict) -> dict | None:
    """The spec switch as a plain object of `SpecConfig` fields, what `--speculative-config`
    and a flip's `changes` take (None: off)."""
    if switches["spec"] == "off":
        return None
    spec = {"method": switches["spec"],
            "num_speculative_tokens": int(switches.get("k", DEFAULT_SWITCHES["k"]))}
    if switches.get("adaptive_k"):
        spec["adaptive_k"] = True
    if switches.get("lookup_first") and switches["spec"] in ("draft", "eagle"):
        spec["prompt_lookup_first"] = True
    return spec


def serve_args(switches: dict, host: str, port: int, join_code: str | None,
               seats: int = 16, max_tokens_cap: int = 128,
               kv_blocks: int | None = DEFAULT_KV_BLOCKS, class_id: str | None = None,
               state: str | None = None) -> list[str]:
    """The `python -m classroom.serve` command line for the class switches. `class_id`,
    `state`: the class and its record (`--class-id`, `--state`: classroom/serve.py)."""
    args = [sys.executable, "-m", "classroom.serve", "--host", host, "--port", str(port),
            "--batching", switches["batching"], "--kv-layout", switches["kv_layout"],
            "--max-num-seqs", str(seats), "--max-tokens-cap", str(max_tokens_cap),
            # students and a thousand simulated users: a deep queue, one answer at a time
            # per student is the student page's own limit
            "--max-queue", "2048", "--max-requests-per-user", "4"]
    if kv_blocks:
        args += ["--num-kv-blocks", str(kv_blocks)]
    if (spec := spec_of(switches)) is not None:
        args += ["--speculative-config", json.dumps(spec)]
    if switches.get("model"):  # a model on disk (classroom/models.py checks the path)
        from classroom.models import serve_args_for

        args += serve_args_for(switches["model"])
    if class_id:
        args.append(f"--class-id={class_id}")
    if state:
        args.append(f"--state={state}")
    if join_code:
        args.append(f"--api-key={join_code}")  # one argument: a code may start with "-"
    return args


def configured_server(secrets=None) -> dict | None:
    """An already running class server named in server-side configuration, or None: the
    environment first, else `secrets` (a mapping: the `[classroom]` table of the app's
    secrets)."""
    conf = {k: os.environ.get(f"SERVELAB_CLASS_{k.upper()}")
            for k in ("url", "join_code", "admin_key")}
    if not conf["url"] and secrets:
        conf = {k: secrets.get(k) for k in conf}
    return conf if conf["url"] else None


def _end(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds (at once when grace is 0)."""
    if proc.poll() is not None:
        return
    if grace <= 0:
        proc.kill()
        proc.wait(10)
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@atexit.register
def _end_all() -> None:
    for proc in list(_LIVE):
        _end(proc, grace=3.0)


@dataclass
class ClassServer:
    """One class server: started here (`start`) or adopted from configuration (`adopt`)."""

    url: str = ""
    join_code: str | None = None
    admin_key: str | None = None
    host: str = "127.0.0.1"
    switches: dict = field(default_factory=lambda: dict(DEFAULT_SWITCHES))
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    adopted: bool = False
    _log_seen: tuple | None = field(default=None, repr=False)  # (log size, since when)

    @classmethod
    def start(cls, switches: dict, on_network: bool = False, port: int | None = None,
              seats: int = 16, ready_timeout: float = 180.0,
              kv_blocks: int | None = DEFAULT_KV_BLOCKS, class_id: str | None = None,
              state: str | None = None, join_code: str | None = None) -> ClassServer:
        """Start `python -m classroom.serve` on 127.0.0.1 (only this computer can join), or on
        this machine's network address when the teacher asks for it (phones on the same
        network can; the join code is then required). `join_code`: the class's (default: a
        new one). `ready_timeout`: how long it may stay silent while starting (`starting`); 0
        returns at once (the caller polls `starting()`, as the Classroom page does while a
        model downloads)."""
        host = (lan_address() or "127.0.0.1") if on_network else "127.0.0.1"
        port = port or free_port(host)
        join_code = join_code or secrets.token_urlsafe(6)  # short: read off a projector
        admin_key = secrets.token_urlsafe(24)
        log = tempfile.NamedTemporaryFile("w", prefix="servelab-class-", suffix=".log",
                                          delete=False)
        from engine.threads import server_env

        env = dict(server_env(os.environ), SERVELAB_ADMIN_KEY=admin_key,
                   PYTHONPATH=str(IMPORT_ROOT))
        proc = subprocess.Popen(serve_args(switches, host, port, join_code, seats,
                                           kv_blocks=kv_blocks, class_id=class_id,
                                           state=state),
                                cwd=IMPORT_ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        _LIVE.add(proc)
        srv = cls(url=f"http://{host}:{port}", join_code=join_code, admin_key=admin_key,
                  host=host, switches=dict(switches), proc=proc, log_path=Path(log.name))
        if ready_timeout:
            srv.wait_ready(ready_timeout)
        return srv

    @classmethod
    def adopt(cls, conf: dict) -> ClassServer:
        srv = cls(url=conf["url"].rstrip("/"), join_code=conf.get("join_code"),
                  admin_key=conf.get("admin_key"), adopted=True)
        with contextlib.suppress(Exception):
            srv.switches = switches_of(srv.get("/v1/servelab/config").json())
        return srv

    @property
    def headers(self) -> dict:
        key = self.admin_key or self.join_code
        return {"Authorization": f"Bearer {key}"} if key else {}

    def get(self, path: str, timeout: float = 10.0) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers, timeout=timeout)

    def alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return False
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, n: int = 2000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n:]

    def starting(self, quiet_s: float | None = None) -> bool:
        """True while the server is still starting, False once it answers. RuntimeError, the
        server stopped: when it exited (with its log's tail), or when it answered nothing and
        wrote nothing to its log for `quiet_s` seconds (default START_QUIET_S). A start that
        writes (a model downloading, its progress bar moving) may take as long as it writes."""
        quiet_s = START_QUIET_S if quiet_s is None else quiet_s
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError("the class server exited while starting:\n" + self.log_tail())
        if self.alive():
            return False
        size, now = self._log_size(), time.monotonic()
        if self._log_seen is None or size != self._log_seen[0]:
            self._log_seen = (size, now)  # its last sign of life
        elif now - self._log_seen[1] > quiet_s:
            self.stop(abort=True)
            raise RuntimeError(f"the class server did not answer, and wrote nothing, for "
                               f"{quiet_s:.0f} s")
        return True

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path is not None else 0
        except OSError:
            return 0

    def wait_ready(self, quiet_s: float | None = None) -> None:
        """Until the server answers (`starting`)."""
        while self.starting(quiet_s):
            time.sleep(0.3)

    def engine_status(self, timeout: float = 5.0) -> dict:
        """The server's engine swap status and configuration (`GET /v1/servelab/engine`)."""
        return self.get("/v1/servelab/engine", timeout=timeout).json()

    def switch(self, switches: dict, abort: bool = False, drain_s: float = DRAIN_S,
               kv_blocks: int | None = None) -> dict:
        """Ask the server to swap its engine for one with these switches (it keeps its
        address and join code); returns at once with the status. Raises with the server's
        message when it refuses. The changes are EngineConfig's fields as they are, `spec`
        a plain object of SpecConfig's (k included), the shape the server reads back."""
        changes = {"batching": switches["batching"], "kv_layout": switches["kv_layout"],
                   "spec": spec_of(switches)}
        if kv_blocks:
            changes["num_kv_blocks"] = int(kv_blocks)
        r = httpx.post(self.url + "/v1/servelab/engine", headers=self.headers, timeout=10,
                       json={"changes": changes, "abort": abort, "drain_s": drain_s})
        if r.status_code != 202:
            try:
                msg = r.json()["error"]["message"]
            except Exception:
                msg = f"HTTP {r.status_code}"
            raise RuntimeError(msg)
        return r.json()

    def busy(self) -> int:
        """Requests in the server (running + waiting), from /metrics; 0 if it cannot say."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            text = self.get("/metrics").text
        except httpx.HTTPError:
            return 0
        n = 0.0
        for fam in text_string_to_metric_families(text):
            if fam.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                n += sum(s.value for s in fam.samples)
        return int(n)

    def drain(self, timeout: float = 120.0) -> bool:
        """Wait (bounded) until no request is in the server; True if it emptied."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.busy() == 0:
                return True
            time.sleep(0.5)
        return False

    def stop(self, abort: bool = False) -> None:
        """End the process this page started (never an adopted one): gracefully (uvicorn
        lets the answers in flight finish, up to a grace period), or with `abort` at once."""
        if self.proc is not None:
            _end(self.proc, grace=0.0 if abort else 10.0)
            _LIVE.discard(self.proc)
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


# a progress bar as tqdm writes it into a log (huggingface_hub's downloads): "name:  45%|###
# | 445M/988M [00:10<00:12, 44.5MB/s]", each update after a carriage return
_BAR = re.compile(r"^(?P<name>.*?):?\s*(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<rest>.*)$")


def start_progress(log_text: str) -> tuple[float | None, str] | None:
    """What a starting class server is doing, from its log's tail: the newest line, as
    (fraction done, text) for a download's progress bar ("model.safetensors 45% · 445M/988M
    [00:10<00:12, 44.5MB/s]"), (None, the line) for any other; None for an empty log."""
    for line in reversed(re.split(r"[\r\n]+", log_text)):
        line = line.strip()
        if not line:
            continue
        m = _BAR.match(line)
        if m:
            pct = min(100, int(m["pct"]))
            name = m["name"].strip() or "download"
            return pct / 100, f"{name} {pct}% · {m['rest'].strip()}"
        return None, line[-200:]
    return None


def switches_of(config: dict) -> dict:
    """An engine configuration (as `GET /v1/servelab/config` gives it) as the class switches."""
    spec = config.get("spec") or {}
    return {"batching": config["batching"], "kv_layout": config["kv_layout"],
            "spec": spec.get("method", "off"),
            "k": spec.get("num_speculative_tokens", DEFAULT_SWITCHES["k"]),
            "adaptive_k": bool(spec.get("adaptive_k")),
            "lookup_first": bool(spec.get("prompt_lookup_first"))}


def slim(report: dict, received: float | None = None) -> dict:
    """What the gauges' history needs of a report (the KV map and owners dropped), with the
    time it arrived here (`t`: how long the projector keeps a seat that was just freed)."""
    kv = report["kv"]
    return {"step": report["step"], "wall_s": report["wall_s"], "seats": report["seats"],
            "t": time.monotonic() if received is None else received,
            "waiting": report["waiting"], "emitted": [
                {"request_id": e["request_id"], "token_ids": e["token_ids"]}
                for e in report["emitted"]],
            "finished": report["finished"], "spec": report.get("spec", []),
            # why they waited this step, counted by code (engine/waits.py): the tally chart
            "wait_counts": count_codes(report.get("waits") or {}),
            "metrics": report.get("metrics", {}),
            "kv": {"used_slots": kv["used_slots"], "allocated_slots": kv["allocated_slots"],
                   "total_slots": kv["total_slots"],
                   # blocks held per request (only seated requests hold any: a few entries)
                   "blocks_held": {rid: len(t) for rid, t in kv["block_tables"].items()}}}


class StepStream:
    """Reads the class server's step stream in a thread: the newest report, a slim history,
    and every owner seen recently (request id -> {"user", "kind"})."""

    def __init__(self, url: str, headers: dict):
        self.url, self.headers = url, headers
        self.latest: dict | None = None
        self.history: deque[dict] = deque(maxlen=HISTORY)
        self.owners: dict[str, dict] = {}
        self.events = 0
        self.restart: dict | None = None  # the latest engine-swap event
        self.owners_t: dict[str, float] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="class-steps", daemon=True)
        self._thread.start()

    def snapshot(self) -> tuple[dict | None, list[dict], dict]:
        with self._lock:
            return self.latest, list(self.history), dict(self.owners)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # read timeout above the server's 15 s keep-alive comment
                with httpx.stream("GET", self.url + "/v1/servelab/steps", headers=self.headers,
                                  timeout=httpx.Timeout(30.0, connect=5.0)) as r:
                    if r.status_code != 200:
                        self.error = f"step stream: HTTP {r.status_code}"
                        self._stop.wait(2.0)
                        continue
                    self.error = None
                    for line in r.iter_lines():
                        if self._stop.is_set():
                            return
                        if line.startswith("data: "):
                            self._take(json.loads(line[6:]))
            except (httpx.HTTPError, OSError, ValueError) as exc:
                self.error = f"step stream: {type(exc).__name__}"
                self._stop.wait(1.0)

    def _take(self, report: dict) -> None:
        with self._lock:
            if report.get("type") == "restart":  # an engine swap's progress, not a step
                self.restart = report
                if report.get("phase") == "serving":
                    self.history.clear()  # the new engine's steps start again at 1
                return
            self.latest = report
            self.history.append(slim(report))
            self.owners.update(report.get("owners", {}))
            if len(self.owners) > 4096:  # keep the recent half
                for rid in list(self.owners)[:2048]:
                    del self.owners[rid]
            self.events += 1


_PROGRESS = re.compile(r"(\d+)/(\d+)")


class LoadRun:
    """`python -m benchmarks.load` against the class server, as a child process."""

    def __init__(self, server: ClassServer, users: int, arrival: str, rate: float,
                 max_tokens_scale: float = 0.25, timeout_s: float = 900.0):
        if not 1 <= users <= 1000:
            raise ValueError(f"users must be 1 to 1000, got {users}")
        if arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {arrival!r}")
        self.users, self.switches = users, dict(server.switches)
        self.done, self.total = 0, users
        self.summary: dict | None = None
        self.json_path = Path(tempfile.mkstemp(prefix="servelab-load-", suffix=".json")[1])
        args = [sys.executable, "-m", "benchmarks.load", "--base-url", server.url + "/v1",
                "--users", str(users), "--arrival", arrival, "--workload", "longtail",
                "--max-tokens-scale", str(max_tokens_scale), "--timeout", str(timeout_s),
                "--json", str(self.json_path)]
        if arrival != "all-at-once":
            args += ["--rate", str(rate)]
        env = dict(os.environ, PYTHONPATH=str(IMPORT_ROOT))
        # the simulated riders (`sim-*` users) are the teacher's: the admin key sends them
        key = server.admin_key or server.join_code
        if key:
            args.append(f"--api-key={key}")  # a code may start with "-"
        self.proc = subprocess.Popen(args, cwd=IMPORT_ROOT, env=env,
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        _LIVE.add(self.proc)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """tqdm redraws its bar with carriage returns: the last 'done/total' is the progress."""
        buf = ""
        for chunk in iter(lambda: self.proc.stderr.read1(256), b""):
            buf = (buf + chunk.decode(errors="replace"))[-512:]
            if m := list(_PROGRESS.finditer(buf)):
                self.done, self.total = int(m[-1].group(1)), int(m[-1].group(2))

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def result(self) -> dict | None:
        """The summary once the run is over (None while it runs)."""
        if self.summary is None and not self.running:
            with contextlib.suppress(OSError, ValueError):
                self.summary = json.loads(self.json_path.read_text())["http"]
            with contextlib.suppress(OSError):
                self.json_path.unlink()
        return self.summary

    def stop(self) -> None:
        _end(self.proc, grace=5.0)
        _LIVE.discard(self.proc)


class ClassRoom:
    """The app process's one class: its server, step stream, load runs and results table."""

    def __init__(self):
        self.server: ClassServer | None = None
        self.stream: StepStream | None = None
        self.load: LoadRun | None = None
        self.table: dict[str, dict] = {}  # configuration -> measured row
        self.pending: dict | None = None  # a switch flip under way: its switches and start
        self.launching: ClassServer | None = None  # a server started, not answering yet
        self.error = ""
        self.on_network = False
        self.kv_blocks = DEFAULT_KV_BLOCKS
        self.redraw_ms: deque[float] = deque(maxlen=200)
        # the class every server this app starts keeps: a Stop and Start, a model change or
        # a crashed class server picks its phones, rounds and tests up again from its record
        # (<ServeLab cache>/class/<class_id>.sqlite, or $SERVELAB_CLASS_STATE), with the same
        # join code (the QR code on the projector stays valid)
        self.class_id = time.strftime("class-%Y%m%d-%H%M-") + secrets.token_hex(2)
        self.state_path = os.environ.get("SERVELAB_CLASS_STATE") or None
        self.join_code = secrets.token_urlsafe(6)
        # and the same port when it is free: the same origin, so each phone's page keeps the
        # id it stored (localStorage is per origin) and its ballots and test stay its own
        self.port: int | None = None

    def masking(self) -> dict:
        """The class's hide list and word list (the votes router's `masking`), for every name
        the projector shows; empty while no class server answers."""
        if self.server is None:
            return {}
        try:
            r = self.server.get("/v1/servelab/votes/masking", timeout=2)
            return r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def timeline(self, request_id: str) -> dict | None:
        """One student's request, stretch by stretch, as the class server keeps it
        (`GET /v1/servelab/class/timeline/{id}`); None when it no longer does."""
        if self.server is None:
            return None
        try:
            r = self.server.get(f"/v1/servelab/class/timeline/{quote(request_id, safe='')}",
                                timeout=2)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def trace(self) -> bytes:
        """The class server's recent steps as a Chrome trace (`GET /v1/servelab/class/trace`),
        the JSON file's bytes; a trace with no events, saying why, when it cannot be read
        (the download runs in a thread of its own: nothing there can show an error)."""
        try:
            if self.server is None:
                raise RuntimeError("no class server is running")
            r = self.server.get("/v1/servelab/class/trace", timeout=30)
            r.raise_for_status()
            return r.content
        except (httpx.HTTPError, RuntimeError) as exc:
            return json.dumps({"traceEvents": [], "displayTimeUnit": "ms",
                               "otherData": {"error": str(exc)}}).encode()

    @property
    def status(self) -> str:
        """Non-empty while a switch flip is under way (the page's older name for it)."""
        return "restarting" if self.pending is not None else ""

    def attach(self, server: ClassServer) -> None:
        self.server = server
        self.stream = StepStream(server.url, server.headers)

    def start(self, switches: dict, on_network: bool, kv_blocks: int | None = None) -> None:
        """Start the class server and wait until it answers (`begin_start` and `poll_start`
        are the same in steps, for a page that shows the progress and offers Cancel)."""
        self.begin_start(switches, on_network, kv_blocks)
        self.launching.wait_ready()
        self.poll_start()

    def begin_start(self, switches: dict, on_network: bool, kv_blocks: int | None = None
                    ) -> None:
        """Launch the class server and return at once; `poll_start` follows it."""
        self.on_network = on_network
        self.kv_blocks = kv_blocks or self.kv_blocks
        host = (lan_address() or "127.0.0.1") if on_network else "127.0.0.1"
        port = self.port if self.port and port_is_free(host, self.port) else None
        self.launching = ClassServer.start(switches, on_network=on_network, port=port,
                                           kv_blocks=self.kv_blocks, class_id=self.class_id,
                                           state=self.state_path, join_code=self.join_code,
                                           ready_timeout=0)

    def poll_start(self) -> tuple[float | None, str] | None:
        """A look at the server being started: once it answers it is attached (and None is
        returned); while it starts, its progress (`start_progress`); RuntimeError (and
        nothing attached) when it exited or stayed silent for START_QUIET_S seconds."""
        srv = self.launching
        if srv is None:
            return None
        try:
            still = srv.starting()
        except RuntimeError:
            self.launching = None
            srv.stop()
            raise
        if not still:
            self.launching = None
            self.attach(srv)
            self.port = int(srv.url.rsplit(":", 1)[1])
            return None
        return start_progress(srv.log_tail()) or (None, "")

    def cancel_start(self) -> None:
        """Stop the server being started (a download the teacher gave up on: huggingface_hub
        resumes it on the next start)."""
        srv, self.launching = self.launching, None
        if srv is not None:
            srv.stop(abort=True)

    def stop(self, abort: bool = False) -> None:
        if self.load is not None:
            self.load.stop()
            self.load = None
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self.server is not None:
            self.server.stop(abort=abort)
            self.server = None
        self.pending = None

    def restart(self, switches: dict, abort: bool, drain_s: float = DRAIN_S,
                kv_blocks: int | None = None) -> None:
        """Flip the switches: the server swaps its engine and keeps its address, join code
        and QR code. It finishes the answers in flight (up to `drain_s` seconds, counting
        down on the projector) or, with `abort`, cuts them now; the cut phones ask again by
        themselves once the new engine is up. `swap_state()` follows it to the end."""
        srv = self.server
        if srv is None:
            raise RuntimeError("no class server is running")
        self.error = ""
        before = srv.engine_status()["status"]["generation"]
        srv.switch(switches, abort=abort, drain_s=drain_s, kv_blocks=kv_blocks)
        if kv_blocks:
            self.kv_blocks = int(kv_blocks)
        self.pending = {"switches": dict(switches), "generation": before,
                        "abort": abort, "since": time.monotonic()}

    def swap_state(self) -> dict | None:
        """The flip under way, from the server: {"phase": "draining" (with "seconds_left",
        "in_flight"), "building", "serving" (done: the page shows the new engine) or
        "failed" (with "error")}; None when no flip is under way."""
        p, srv = self.pending, self.server
        if p is None or srv is None:
            return None
        try:
            st = srv.engine_status(timeout=3.0)
        except (httpx.HTTPError, ValueError):
            return {"phase": "building"}  # the server is busy building: ask again
        status = st["status"]
        if status["generation"] > p["generation"] and status["phase"] == "serving":
            srv.switches = switches_of(st["config"])
            self.pending = None
            return {"phase": "serving", "done": True}
        if status["phase"] == "failed":
            self.pending = None
            self.error = status.get("error", "the new engine could not be built")
            return status
        return status

    def record_load(self) -> None:
        run = self.load
        if run is not None and (summary := run.result()) is not None:
            self.table[config_key(run.switches)] = comparison_row(run.switches, summary)


def config_key(switches: dict) -> str:
    spec = switches["spec"]
    if spec != "off" and switches.get("adaptive_k"):
        spec += " + adaptive k"
    if spec.split()[0] in ("draft", "eagle") and switches.get("lookup_first"):
        spec += " + lookup"
    return f"{switches['batching']} · {switches['kv_layout']} · spec {spec}"


def offered_switches() -> dict:
    """SWITCHES as the class page offers them: the EAGLE head only once it is trained (the
    class server runs the default model; `python -m engine.spec.train_draft` builds it)."""
    from engine.config import EngineConfig
    from engine.spec.eagle import head_path

    eagle = head_path(EngineConfig().model).is_file()
    return {k: tuple(v for v in vals if v != "eagle" or eagle) for k, vals in SWITCHES.items()}


def comparison_row(switches: dict, summary: dict) -> dict:
    """One row of the table the class compares at the end (from benchmarks.load's summary)."""

    def ms(x):
        return None if x is None else round(1000 * x, 1)

    return {"configuration": config_key(switches), "users": summary["users"],
            "ok": summary["ok"], "TTFT p50 (ms)": ms(summary["ttft_p50_s"]),
            "TTFT p99 (ms)": ms(summary["ttft_p99_s"]),
            "TPOT p50 (ms)": ms(summary["tpot_p50_s"]),
            "output tok/s": round(summary["output_tok_per_s"], 1)}
