"""A recording in the app's place of a live run: `RecordedSession` and `RecordedRun` offer what
the pages read from `Session` and `Run` (app/state.py), from a recording's reports (engine/
recording.py), with no engine built and no model loaded.

- `RecordedRun`: one recorded run. `history` holds the reports up to the session's clock,
  `done` once the clock passed its last step; `engine` is a small stand-in with what pages
  read (`config`, `describe()`, `model.weight_bytes`, `tokenizer.convert_ids_to_tokens`).
- `RecordedSession`: the recorded runs keyed by `Settings`, one clock (`tick`), Step / Play /
  Reset as in a live session. A page asking for a variant the recording does not hold gets a
  ValueError that says so (the live view shows it as an error, the page goes on).
- `session_recording(session)`: the app's live session written as a recording (every run it
  holds, with the job names, prompts and token pieces), for the sidebar's save button.

Streamlit-free, as app/state.py; app/replay.py draws the sidebar and the label.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from types import SimpleNamespace

from app.state import Session, Settings
from engine.recording import (
    Recorder,
    Recording,
    RecordingError,
    engine_pieces,
    machine_facts,
    machine_line,
    read_recording,
)

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS_DIR = ROOT / "assets" / "recordings"


def bundled_recordings() -> list[Path]:
    """The recordings shipped under assets/recordings/ (a laptop class can open them)."""
    return sorted(RECORDINGS_DIR.glob("*.jsonl.gz")) if RECORDINGS_DIR.is_dir() else []


def settings_from(d: dict | None) -> Settings | None:
    """Settings from a recorded dict (unknown fields dropped; None if it is not the app's)."""
    if not isinstance(d, dict):
        return None
    names = {f.name for f in dataclasses.fields(Settings)}
    try:
        return Settings(**{k: v for k, v in d.items() if k in names})
    except TypeError:
        return None


def settings_from_engine(d: dict | None) -> Settings | None:
    """The app's Settings that describe a recorded EngineConfig (an engine's or the class
    server's recording), so the pages' variants find its run."""
    if not isinstance(d, dict):
        return None
    spec = d.get("spec") if isinstance(d.get("spec"), dict) else None
    try:
        return Settings(
            batching=d.get("batching", "continuous"), kv_layout=d.get("kv_layout", "paged"),
            spec=spec.get("method", "off") if spec else "off",
            k=int(spec.get("num_speculative_tokens", 4)) if spec else Settings().k,
            seats=int(d.get("max_num_seqs", Settings().seats)),
            num_blocks=int(d.get("num_kv_blocks") or Settings().num_blocks),
            block_size=int(d.get("block_size", Settings().block_size)),
            prefix_caching=bool(d.get("enable_prefix_caching", False)),
            model=str(d.get("model", Settings().model)))
    except (TypeError, ValueError):
        return None


def engine_config_from(d: dict | None):
    """EngineConfig from its recorded dict; a plain namespace when this version cannot build
    one (a recording from another version still replays)."""
    from engine.config import EngineConfig, SpecConfig

    if not isinstance(d, dict):
        return None
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    kw = {k: v for k, v in d.items() if k in names}
    try:
        if isinstance(kw.get("spec"), dict):
            spec_names = {f.name for f in dataclasses.fields(SpecConfig)}
            kw["spec"] = SpecConfig(**{k: v for k, v in kw["spec"].items() if k in spec_names})
        return EngineConfig(**kw)
    except (TypeError, ValueError):
        ns = SimpleNamespace(**d)
        ns.blocks_per_seq = -(-int(d.get("max_model_len", 0)) // max(1, int(d.get("block_size", 1))))
        return ns


class RecordedTokenizer:
    """The tokenizer's pieces of the tokens a run used, as recorded."""

    def __init__(self, pieces: dict[int, str]):
        self.pieces = pieces

    def convert_ids_to_tokens(self, tid: int) -> str:
        return self.pieces.get(int(tid), "")


class RecordedEngine:
    """What pages read of `run.engine`, from the recording's header."""

    def __init__(self, meta: dict, recording: Recording):
        self.config = engine_config_from(meta.get("engine_config") or meta.get("config")
                                         or recording.config)
        self.model = SimpleNamespace(weight_bytes=int(meta.get("weight_bytes") or 0))
        self.tokenizer = RecordedTokenizer(recording.pieces)
        self.description = meta.get("describe") or recording.config.get("model", "?")
        self.requests: dict = {}

    def describe(self) -> str:
        return str(self.description)


class RecordedRun:
    """One recorded run, drawn up to the session's clock."""

    def __init__(self, settings: Settings, reports: list[dict], meta: dict,
                 recording: Recording, names: dict, prompts: dict):
        self.settings = settings
        self.reports = reports
        self.first_step = reports[0]["step"] if reports else 1
        self.last_step = reports[-1]["step"] if reports else 0
        self.engine = RecordedEngine(meta, recording)
        self.names: dict[str, str] = dict(names)
        self.prompts: dict[str, str] = dict(prompts)
        self.history: list[dict] = []
        self.ticks = 0

    def seek(self, tick: int) -> None:
        """Show the steps up to the clock (a recording that starts later starts at its first)."""
        shown = tick + self.first_step - 1
        self.history = [r for r in self.reports if r["step"] <= shown]
        self.ticks = tick

    @property
    def done(self) -> bool:
        return len(self.history) >= len(self.reports)

    @property
    def last(self) -> dict | None:
        return self.history[-1] if self.history else None

    @property
    def step_count(self) -> int:
        return self.history[-1]["step"] if self.history else 0

    def outputs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for r in self.history:
            for e in r.get("emitted", ()):
                out[e["request_id"]] = out.get(e["request_id"], "") + e.get("text", "")
        return out


class RecordedSession(Session):
    """A recording in the place of a live Session: the same clock and controls, no engine."""

    recording: Recording
    label: str

    def __init__(self, recording: Recording, label: str = ""):
        runs: dict[Settings, RecordedRun] = {}
        for i, (meta, reports) in enumerate(zip(recording.header["runs"], recording.runs)):
            meta = meta if isinstance(meta, dict) else {}
            settings = (settings_from(meta.get("settings"))
                        or settings_from_engine(meta.get("config") or recording.config)
                        or Settings())
            if settings in runs or not reports:
                continue
            names = recording.names[i] if i < len(recording.names) else {}
            prompts = recording.prompts[i] if i < len(recording.prompts) else {}
            if not names:  # a class server's run: who asked names each request
                names = {rid: (o.get("user") if isinstance(o, dict) else str(o))
                         for rid, o in recording.owners.items()}
            runs[settings] = RecordedRun(settings, reports, meta, recording, names, prompts)
        if not runs:
            raise RecordingError("recording holds no step reports", "empty")
        first = next(iter(runs))
        super().__init__(settings=first)
        self.runs = runs  # type: ignore[assignment]
        self.recording = recording
        self.label = label
        # the text a page shows for a variant the recording lacks (the app sets its own
        # language's text)
        self.lacks_message = lambda: RECORDING_LACKS

    # --- what a live Session does with an engine ------------------------------------------
    def run(self, settings: Settings | None = None) -> RecordedRun:  # type: ignore[override]
        settings = settings or self.settings
        run = self.runs.get(settings)
        if run is None:
            raise ValueError(self.lacks_message())
        run.seek(self.tick)
        return run

    @property
    def primary(self) -> RecordedRun:  # type: ignore[override]
        return self.run(self.settings)

    def catch_up(self, run) -> None:
        run.seek(self.tick)

    def apply(self, settings: Settings) -> bool:
        return False  # a recording's settings are what it was recorded with

    def reset(self) -> None:
        self.tick = 0
        self.playing = False

    def step(self) -> None:
        if not all(r.done for r in self.runs.values()):
            self.tick += 1

    def max_model_len(self, settings: Settings) -> int:
        cfg = self.primary.engine.config
        return int(getattr(cfg, "max_model_len", 0))

    def add_prompt(self, text: str, max_tokens: int = 32) -> str:
        raise ValueError("a recording cannot take new prompts")

    @property
    def total_steps(self) -> int:
        return max(len(r.reports) for r in self.runs.values())


# the message a page shows for a run the recording does not hold (the app's i18n key carries
# the student-facing text; this English line is what the ValueError says underneath)
RECORDING_LACKS = "this recording holds no run for these settings"


def open_recording(src, label: str = "") -> RecordedSession:
    """A RecordedSession from a path, bytes or a binary file; RecordingError if it is not a
    recording this app can replay."""
    return RecordedSession(read_recording(src), label)


def run_meta(run, name: str) -> dict:
    """A live run's facts a replay needs: its Settings, engine config and description."""
    eng = run.engine
    return {"name": name, "settings": dataclasses.asdict(run.settings),
            "engine_config": eng.config, "describe": eng.describe(),
            "weight_bytes": int(getattr(eng.model, "weight_bytes", 0))}


def session_recording(session: Session, machine: dict | None = None,
                      date: str | None = None) -> bytes:
    """The live session's runs as one recording (gzip bytes). Each run is replayed from step 1
    only if its history still holds step 1 (app/state.py keeps the newest reports)."""
    runs = [(s, r) for s, r in session.runs.items() if r.history]
    if not runs:
        raise ValueError("nothing to record yet: step the run first")
    primary = session.runs.get(session.settings)
    if primary is not None and primary.history:  # the sidebar's run first: it opens the replay
        runs.sort(key=lambda sr: sr[0] != session.settings)
    buf = io.BytesIO()
    device = str(getattr(runs[0][1].engine, "device", "cpu"))
    rec = Recorder(buf, dataclasses.asdict(runs[0][0]), machine or machine_facts(device),
                   runs=[run_meta(r, f"run{i}") for i, (_, r) in enumerate(runs)],
                   source="app", date=date)
    for i, (_, r) in enumerate(runs):
        for report in r.history:
            rec.report(report, i)
        rec.annex("names", run=i, names=r.names)
        rec.annex("prompts", run=i, prompts=r.prompts)
        rec.add_pieces(engine_pieces(r.engine.tokenizer, r.history))
    rec.close()
    return buf.getvalue()


def session_trace(session: Session) -> bytes:
    """The live session's runs as one trace (engine/trace.py), each run its own processes,
    named by its switches; the sidebar's run first."""
    from classroom.client import config_key
    from engine.trace import traces_of

    runs = [(s, r) for s, r in session.runs.items() if r.history]
    runs.sort(key=lambda sr: sr[0] != session.settings)
    trace = traces_of([(config_key(dataclasses.asdict(s)), r.history) for s, r in runs],
                      "ServeLab app")
    return json.dumps(trace, ensure_ascii=False).encode("utf-8")


def record_session_runs(session: Session, variants: list[Settings], path,
                        max_ticks: int = 2000) -> Path:
    """Build `variants` in a live session, play them to the end and save the recording at
    `path` (the bundled recording is made this way)."""
    for v in variants:
        session.run(v)
    while not all(session.runs[v].done for v in variants) and session.tick < max_ticks:
        session.step()
        for v in variants:
            session.run(v)
    for v in variants:
        run = session.runs[v]
        if run.history and run.history[0]["step"] != 1:
            raise ValueError("a run's history no longer starts at step 1; record fewer steps")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(session_recording(session))
    return path


def describe(session: RecordedSession) -> dict:
    """The label's facts: machine, date, configuration, source, steps."""
    rec = session.recording
    s = session.settings
    return {"machine": machine_line(rec.machine), "date": rec.date, "source": rec.source,
            "model": s.model, "batching": s.batching, "kv_layout": s.kv_layout, "spec": s.spec,
            "seats": s.seats, "blocks": s.num_blocks, "steps": session.total_steps,
            "runs": len(session.runs)}


def page_variants(settings: Settings | None = None) -> list[Settings]:
    """The runs the live pages draw for `settings`: itself, static batching, the contiguous
    layout and n-gram speculation (the dashboard, batching, paging and speculation pages)."""
    s = settings or Settings()
    variants = [s, s.with_(batching="static" if s.batching == "continuous" else "continuous"),
                s.with_(kv_layout="contiguous" if s.kv_layout == "paged" else "paged"),
                s.with_(spec="ngram") if s.spec == "off" else s.with_(spec="off")]
    return list(dict.fromkeys(variants))


def main(argv: list[str] | None = None) -> int:
    """`python -m app.recorded OUT.jsonl.gz [--requests N] [--workload NAME]`: record the
    runs every live page draws, for a class to replay without the engine."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m app.recorded", description=main.__doc__)
    ap.add_argument("out")
    ap.add_argument("--requests", type=int, default=Settings().num_requests)
    ap.add_argument("--workload", default=Settings().workload)
    args = ap.parse_args(argv)
    settings = Settings(num_requests=args.requests, workload=args.workload)
    session = Session(settings=settings)
    path = record_session_runs(session, page_variants(settings), args.out)
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB, "
          f"{max(len(r.history) for r in session.runs.values())} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
