"""Recordings: a run's StepReports kept in one gzip-compressed JSONL file, replayed without an
engine or a model.

The file, line by line (UTF-8 JSON, one object a line):

1. the header: ``{"kind": "servelab-recording", "version": 1, "machine": {...}, "date": ISO
   8601 UTC, "config": {...}, "runs": [{"name", "config"}...], "source": "engine" | "app" |
   "class-server"}``. ``machine`` says where the steps ran (CPU model and flags, or the GPU);
   ``config`` is the configuration the recording was made under (an engine's EngineConfig, or
   the app's Settings).
2. then one StepReport a line: ``StepReport.to_dict()`` (from the class server with its
   ``owners`` map), plus ``"run": i`` naming which of the header's runs it belongs to (0 when
   there is one).
3. annexes, each with a ``"kind"`` (a report never has one): ``"owners"`` (request id -> who
   asked, merged in order), ``"votes"`` (the class's votes, kept as given), ``"names"`` and
   ``"prompts"`` (request id -> job name / prompt, per run), ``"pieces"`` (token id -> the
   tokenizer's piece, so a replay can show a token's bytes without the tokenizer), and
   ``"end"`` (the step count and when recording stopped).

Pure: no streamlit, no torch at import (the app's replay must not need the engine). Reading a
malformed or foreign file raises `RecordingError`, whose message names what was wrong.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import gzip
import io
import json
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

KIND = "servelab-recording"
VERSION = 1
# what a replay needs of every report line (the pages read these)
REPORT_KEYS = ("step", "seats", "waiting", "emitted", "kv", "metrics")
MAX_LINE_BYTES = 32 << 20  # one report far above any real one: a corrupt or hostile file


class RecordingError(ValueError):
    """A file that is not a readable ServeLab recording; the message says why, and `code`
    names the kind of fault (the app shows it in the reader's language): "unreadable",
    "not_gzip", "damaged", "too_large", "not_json", "foreign", "version", "bad_line",
    "empty"."""

    def __init__(self, message: str, code: str = "bad_line"):
        super().__init__(message)
        self.code = code


def machine_facts(device: str | None = None) -> dict:
    """Where steps run: the CPU's model name, core count and the vector flags the kernels use,
    and the GPU (name, memory) when `device` is CUDA."""
    facts: dict = {"platform": platform.platform(), "python": platform.python_version(),
                   "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and "cpu_model" not in facts:
            facts["cpu_model"] = value.strip()
        elif key in ("flags", "Features") and "cpu_flags" not in facts:
            wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "fma", "f16c",
                      "avx512_vnni", "avx_vnni", "asimd", "asimddp", "sve", "bf16", "i8mm")
            have = set(value.split())
            facts["cpu_flags"] = [f for f in wanted if f in have]
    if device and str(device).startswith("cuda"):
        try:
            import torch

            props = torch.cuda.get_device_properties(torch.device(device))
            facts["gpu"] = props.name
            facts["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        except Exception as exc:  # no driver in this process: say so rather than guess
            facts["gpu"] = f"unknown ({exc})"
    return facts


def machine_line(machine: dict) -> str:
    """One line for a label: the GPU if any, else the CPU model and its core count."""
    if machine.get("gpu"):
        return str(machine["gpu"])
    cpu = machine.get("cpu_model") or machine.get("cpu") or "?"
    cores = machine.get("cores")
    return f"{cpu} ({cores} cores)" if cores else str(cpu)


def jsonable(obj):
    """Dataclasses (EngineConfig with its SpecConfig), tuples and paths as plain JSON data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def _dump(obj) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


class Recorder:
    """Writes a recording as the steps happen: the header at once, then each report.

    `path` is a file path or a binary file object (the app writes into memory). Reports
    are dicts (`StepReport.to_dict()`, or the step stream's JSON with `owners`) or
    StepReports. `close()` writes the annexes and the end line; use it as a context manager.
    """

    def __init__(self, path, config, machine: dict | None = None,
                 runs: list[dict] | None = None, source: str = "engine",
                 date: str | None = None):
        self.path = path
        self._own = not hasattr(path, "write")
        if self._own:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._raw = open(path, "wb")
        else:
            self._raw = path
        # mtime=0: the same run gives the same bytes (a recording under git does not churn)
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0)
        self.config = jsonable(config)
        self.header = {
            "kind": KIND, "version": VERSION, "machine": machine or machine_facts(),
            "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": self.config, "source": source,
            "runs": [jsonable(r) for r in (runs or [{"name": "run", "config": self.config}])],
        }
        self._gz.write(_dump(self.header))
        self.steps = [0] * len(self.header["runs"])
        self.owners: dict[str, dict] = {}
        self.votes: list = []
        self.pieces: dict[int, str] = {}
        self.closed = False

    def report(self, report, run: int = 0) -> None:
        """One step of run `run`; the class server's `owners` are kept as an annex too."""
        d = report.to_dict() if hasattr(report, "to_dict") else dict(report)
        if not 0 <= run < len(self.steps):
            raise ValueError(f"run {run} is not one of this recording's {len(self.steps)} runs")
        d["run"] = run
        self.steps[run] += 1
        self._gz.write(_dump(d))

    def add_owners(self, owners: dict) -> None:
        self.owners.update(owners)

    def add_votes(self, votes) -> None:
        """The class's votes (as the votes module exports them): kept as given, in order."""
        self.votes.append(jsonable(votes))

    def add_pieces(self, pieces: dict[int, str]) -> None:
        self.pieces.update({int(k): str(v) for k, v in pieces.items()})

    def annex(self, kind: str, **data) -> None:
        if kind in ("servelab-recording",):
            raise ValueError(f"annex kind {kind!r} is reserved")
        self._gz.write(_dump({"kind": kind, **jsonable(data)}))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.owners:
            self.annex("owners", owners=self.owners)
        for v in self.votes:
            self.annex("votes", votes=v)
        if self.pieces:
            self.annex("pieces", pieces={str(k): v for k, v in self.pieces.items()})
        self.annex("end", steps=self.steps,
                   date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        self._gz.close()
        if self._own:
            self._raw.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def record_engine(engine, recorder: Recorder, run: int = 0):
    """Make `engine.step()` also write each report to `recorder` (this engine object only);
    returns the engine. The report is written before the caller sees it."""
    inner = engine.step

    def step():
        report = inner()
        recorder.report(report, run)
        return report

    engine.step = step
    return engine


def engine_pieces(tokenizer, reports: Iterable[dict]) -> dict[int, str]:
    """token id -> tokenizer piece for every token the reports emitted or drafted, and every
    alternative of an emitted token's logprobs (the verifier's alternatives carry their text)."""
    ids: set[int] = set()
    for r in reports:
        for e in r.get("emitted", ()):
            ids.update(int(t) for t in e.get("token_ids", ()))
            for _, alts in e.get("logprobs") or ():  # the alternatives the inspector shows
                ids.update(int(a[0]) for a in alts)
        for s in r.get("spec", ()) or ():  # SpecDecision dicts: drafted tokens, the next one
            ids.update(int(d["token_id"]) for d in s.get("drafted", ()) or ())
            if s.get("next_token_id") is not None:
                ids.add(int(s["next_token_id"]))
    return {i: tokenizer.convert_ids_to_tokens(i) for i in sorted(ids)}


@dataclass
class Recording:
    """A recording read back: the header's facts, each run's reports in order, the annexes."""

    header: dict
    runs: list[list[dict]]
    owners: dict = field(default_factory=dict)
    votes: list = field(default_factory=list)
    names: list[dict] = field(default_factory=list)  # per run: request id -> job name
    prompts: list[dict] = field(default_factory=list)  # per run: request id -> prompt
    pieces: dict[int, str] = field(default_factory=dict)
    end: dict | None = None
    extra: list[dict] = field(default_factory=list)  # annexes of kinds this version skips

    @property
    def machine(self) -> dict:
        return self.header.get("machine") or {}

    @property
    def date(self) -> str:
        return str(self.header.get("date", "?"))

    @property
    def config(self) -> dict:
        return self.header.get("config") or {}

    @property
    def source(self) -> str:
        return str(self.header.get("source", "engine"))

    @property
    def complete(self) -> bool:
        """Did recording stop cleanly (an end line)? A cut-off file still replays."""
        return self.end is not None


def _open_bytes(src) -> bytes:
    if isinstance(src, (bytes, bytearray)):
        return bytes(src)
    if hasattr(src, "read"):
        return src.read()
    path = Path(src)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror or exc}", "unreadable") from None


def read_recording(src, max_bytes: int = 512 << 20) -> Recording:
    """Read a recording from a path, bytes or a binary file; RecordingError if it is not one.

    A file cut off mid-write (no end line, a torn last line) still replays what it holds; a
    foreign file (not gzip, not JSON lines, another kind or a newer version) is refused."""
    raw = _open_bytes(src)
    if raw[:2] != b"\x1f\x8b":
        raise RecordingError("not a ServeLab recording: the file is not gzip-compressed "
                             "(a recording is a .jsonl.gz file)", "not_gzip")
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
            data = gz.read(max_bytes + 1)
    except (OSError, EOFError) as exc:
        # a truncated stream: keep what decompressed (zlib gives what it has in partial reads)
        data = _partial_gunzip(raw)
        if not data:
            raise RecordingError(f"not a ServeLab recording: the gzip data is damaged "
                                 f"({exc})", "damaged") from None
    if len(data) > max_bytes:
        raise RecordingError(f"recording is larger than {max_bytes >> 20} MiB uncompressed", "too_large")
    lines = data.split(b"\n")
    try:
        header = json.loads(lines[0])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RecordingError("not a ServeLab recording: the first line is not JSON", "not_json") from None
    if not isinstance(header, dict) or header.get("kind") != KIND:
        raise RecordingError(f"not a ServeLab recording: the first line's kind is "
                             f"{header.get('kind') if isinstance(header, dict) else None!r}, "
                             f"not {KIND!r}", "foreign")
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise RecordingError(f"recording version {version!r} is not one this ServeLab reads "
                             f"(it reads version {VERSION})", "version")
    runs_meta = header.get("runs") or [{"name": "run", "config": header.get("config")}]
    if not isinstance(runs_meta, list):
        raise RecordingError("recording header: 'runs' must be a list")
    header["runs"] = runs_meta
    rec = Recording(header, [[] for _ in runs_meta], names=[{} for _ in runs_meta],
                    prompts=[{} for _ in runs_meta])
    last = len(lines) - 1
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise RecordingError(f"recording line {n} is larger than {MAX_LINE_BYTES >> 20} MiB")
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if n - 1 == last:  # a torn last line (recording stopped mid-write): drop it
                break
            raise RecordingError(f"recording line {n} is not JSON") from None
        if not isinstance(obj, dict):
            raise RecordingError(f"recording line {n} is not a JSON object")
        kind = obj.get("kind")
        if kind is None:
            missing = [k for k in REPORT_KEYS if k not in obj]
            if missing:
                raise RecordingError(f"recording line {n} is not a step report "
                                     f"(missing {', '.join(missing)})")
            run = obj.pop("run", 0)
            if not isinstance(run, int) or not 0 <= run < len(rec.runs):
                raise RecordingError(f"recording line {n}: run {run!r} is not one of the "
                                     f"header's {len(rec.runs)} runs")
            rec.runs[run].append(obj)
        elif kind == "owners":
            rec.owners.update(obj.get("owners") or {})
        elif kind == "votes":
            rec.votes.append(obj.get("votes"))
        elif kind in ("names", "prompts"):
            run = obj.get("run", 0)
            if isinstance(run, int) and 0 <= run < len(rec.runs):
                getattr(rec, kind)[run].update(obj.get(kind) or {})
        elif kind == "pieces":
            rec.pieces.update({int(k): str(v) for k, v in (obj.get("pieces") or {}).items()})
        elif kind == "end":
            rec.end = obj
        else:
            rec.extra.append(obj)
    for reports in rec.runs:
        for r in reports:  # the class server's step lines carry who asked
            if isinstance(r.get("owners"), dict):
                for rid, who in r["owners"].items():
                    rec.owners.setdefault(rid, who)
    if not any(rec.runs):
        raise RecordingError("recording holds no step reports", "empty")
    return rec


def _partial_gunzip(raw: bytes) -> bytes:
    import zlib

    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        return d.decompress(raw)
    except zlib.error:
        return b""
