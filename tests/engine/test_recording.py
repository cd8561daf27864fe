"""Recordings (engine/recording.py): a real run's reports written to one gzip JSONL file and read
back equal; damaged, foreign and cut-off files."""

from __future__ import annotations

import gzip
import json

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.recording import (
    KIND,
    Recorder,
    RecordingError,
    engine_pieces,
    machine_facts,
    read_recording,
    record_engine,
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A short real run, recorded as it steps; its reports as the caller saw them."""
    path = tmp_path_factory.mktemp("rec") / "run.jsonl.gz"
    cfg = EngineConfig(max_num_seqs=2, num_kv_blocks=24, max_model_len=128)
    eng = LLMEngine(cfg)
    rec = Recorder(path, cfg, machine_facts(str(eng.device)))
    record_engine(eng, rec)
    for prompt in ("The capital of France is", "Once upon a time", "1, 2, 3,"):
        eng.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    seen = []
    while eng.has_unfinished():
        seen.append(eng.step().to_dict())
    rec.add_owners({"r0": {"user": "小明", "kind": "person"}})
    rec.add_votes({"question": "q1", "counts": {"a": 3}})
    rec.add_pieces(engine_pieces(eng.tokenizer, seen))
    rec.close()
    return path, seen, cfg


@pytest.mark.slow  # a real run of the bundled model
def test_replayed_reports_equal_the_live_run(recorded):
    path, seen, cfg = recorded
    rec = read_recording(path)
    assert rec.header["kind"] == KIND and rec.header["version"] == 1
    assert rec.config["max_num_seqs"] == cfg.max_num_seqs
    assert rec.machine.get("cores"), rec.machine
    assert rec.date.startswith("20")
    # through JSON and back, the reports are exactly what the engine returned
    assert rec.runs[0] == json.loads(json.dumps(seen))
    assert [r["step"] for r in rec.runs[0]] == list(range(1, len(seen) + 1))
    assert rec.owners["r0"]["user"] == "小明"
    assert rec.votes == [{"question": "q1", "counts": {"a": 3}}]
    emitted = {t for r in seen for e in r["emitted"] for t in e["token_ids"]}
    assert emitted and emitted <= set(rec.pieces)
    assert rec.complete


@pytest.mark.slow  # a real run of the bundled model
def test_the_first_line_is_the_header_then_one_report_a_line(recorded):
    path, seen, _ = recorded
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    header = json.loads(lines[0])
    assert set(header) >= {"kind", "version", "machine", "date", "config"}
    reports = [json.loads(x) for x in lines[1:] if "kind" not in json.loads(x)]
    assert len(reports) == len(seen)


@pytest.mark.slow  # a real run of the bundled model
def test_a_cut_off_recording_replays_what_it_holds(recorded, tmp_path):
    path, seen, _ = recorded
    data = gzip.decompress(path.read_bytes())
    cut = data[: len(data) // 2]  # mid-line: the torn last line is dropped
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(cut))
    rec = read_recording(tmp_path / "cut.jsonl.gz")
    assert 0 < len(rec.runs[0]) < len(seen)
    assert rec.runs[0] == json.loads(json.dumps(seen))[: len(rec.runs[0])]
    assert not rec.complete
    # a gzip stream cut off too (the process died while writing)
    raw = path.read_bytes()
    rec2 = read_recording(raw[: len(raw) * 3 // 4])
    assert rec2.runs[0] == json.loads(json.dumps(seen))[: len(rec2.runs[0])]


@pytest.mark.parametrize("content, code", [
    (b"plain text, not gzip", "not_gzip"),
    (gzip.compress(b"not json\n"), "not_json"),
    (gzip.compress(b'{"kind": "something-else", "version": 1}\n'), "foreign"),
    (gzip.compress(json.dumps({"kind": KIND, "version": 99}).encode() + b"\n"), "version"),
    (gzip.compress(json.dumps({"kind": KIND, "version": 1}).encode() + b"\n"), "empty"),
    (gzip.compress(json.dumps({"kind": KIND, "version": 1}).encode() + b"\n{\"step\": 1}\n"
                   + b"{}\n"), "bad_line"),
    (gzip.compress(b"\x00\xff\xfe garbage"), "not_json"),
], ids=["plain", "not-json", "foreign", "newer", "no-reports", "not-a-report", "binary"])
def test_malformed_or_foreign_files_get_a_clear_error(content, code, tmp_path):
    p = tmp_path / "bad.jsonl.gz"
    p.write_bytes(content)
    with pytest.raises(RecordingError) as err:
        read_recording(p)
    assert err.value.code == code, str(err.value)
    assert "Traceback" not in str(err.value) and len(str(err.value)) > 10


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(RecordingError, match="nope.jsonl.gz") as err:
        read_recording(tmp_path / "nope.jsonl.gz")
    assert err.value.code == "unreadable"


def test_the_same_run_gives_the_same_header_and_reports(tmp_path):
    """A fixed date: the header and reports of a re-saved recording do not churn."""
    outs = []
    for name in ("a", "b"):
        with Recorder(tmp_path / f"{name}.jsonl.gz", {"model": "m"}, {"cpu": "x"},
                      date="2000-01-01T00:00:00+00:00") as rec:
            rec.report({"step": 1, "seats": [], "waiting": [], "emitted": [], "kv": {},
                        "metrics": {}})
        outs.append(gzip.decompress((tmp_path / f"{name}.jsonl.gz").read_bytes()))
    assert [json.loads(x) for x in outs[0].splitlines()[:2]] == \
        [json.loads(x) for x in outs[1].splitlines()[:2]]
