"""`python -m benchmarks.bench --peer llama-server` (`benchmarks/peer.py`) without llama.cpp.

CI never builds llama.cpp, so these tests check everything around it: the one-line skip when no
`llama-server` is on PATH, the command line it would get, starting a server child process,
waiting for its /health and stopping it by its pid, the requests it is sent and the parsing of
its streamed answers, and the side-by-side table. They run against a fake `llama-server`
written here: a real HTTP server (Python's http.server on 127.0.0.1, the port it is given)
that speaks the same JSON as llama.cpp's (`text` chunks without token ids, a token held back
as llama.cpp holds back one that ends inside a UTF-8 character, `usage` and `timings` in the
last chunk). With a real `llama-server` on PATH, one more test runs it on the bundled model.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import peer
from benchmarks.load import UserResult, summarize
from benchmarks.workloads import get_workload
from engine.config import EngineConfig

pytestmark = pytest.mark.heavy  # starts peer servers as child processes

ROOT = Path(__file__).resolve().parents[2]

FAKE_LLAMA_SERVER = r'''
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
if "--version" in args:
    print("version: 1234 (fake0)\nbuilt with fake-cc for test", file=sys.stderr)
    sys.exit(0)
if "--fail-at-start" in args:
    print("error: failed to load model", flush=True)
    sys.exit(3)
port = int(args[args.index("--port") + 1])
print(json.dumps({"argv": args}), flush=True)
# FAKE_INFO_AT_TRACE: as llama.cpp b11434, the line only at trace verbosity (-lv 4)
trace = "-lv" in args and args[args.index("-lv") + 1] == "4"
if not os.environ.get("FAKE_INFO_AT_TRACE") or trace:
    print("system_info: n_threads = " + args[args.index("-t") + 1] + " | FAKE = 1 |",
          flush=True)
health_calls = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        global health_calls
        if self.path == "/health":
            # "loading the model" for the first call, as llama-server says: the start must wait
            health_calls += 1
            if health_calls < 2:
                return self.send(503, {"error": {"message": "Loading model", "code": 503}})
            return self.send(200, {"status": "ok"})
        if self.path == "/v1/models":
            return self.send(200, {"object": "list", "data": [{"id": "model.gguf"}]})
        self.send(404, {"error": {"message": "File Not Found", "code": 404}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        want = {"stream": True, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
                "model": "model.gguf"}
        bad = {k: body.get(k) for k, v in want.items() if body.get(k) != v}
        if self.path != "/v1/completions" or bad or not isinstance(body.get("max_tokens"), int):
            return self.send(400, {"error": {"message": f"unexpected request: {bad}",
                                             "code": 400}})
        # one write per line: print's text and its newline are two writes, which the server's
        # handler threads can interleave into one line holding two objects
        sys.stdout.write(json.dumps({"request": {k: body[k] for k in ("max_tokens", "user")}})
                         + "\n")
        sys.stdout.flush()
        n = body["max_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        def event(obj):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()
        held = ""
        for i in range(n):
            time.sleep(0.002)
            held += f"t{i} "
            if i % 5 == 1 and i < n - 1:
                continue  # held back, sent with the next token (a split UTF-8 character)
            event({"choices": [{"text": held, "index": 0, "logprobs": None,
                                "finish_reason": None}], "object": "text_completion"})
            held = ""
        event({"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
               "object": "text_completion",
               "usage": {"completion_tokens": n, "prompt_tokens": len(body["prompt"].split()),
                         "total_tokens": n + len(body["prompt"].split())},
               "timings": {"predicted_n": n, "predicted_per_second": 500.0}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture
def fake_binary(tmp_path) -> str:
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\n{FAKE_LLAMA_SERVER}")
    path.chmod(0o755)
    return str(path)


def test_no_llama_server_on_path_skips_with_one_line_and_exit_0(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--peer", "llama-server"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == peer.skip_message("llama-server")
    assert "llama-server not found on PATH: skipping" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_a_bad_peer_binary_or_engine_option_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        peer.main(["--peer-binary", str(tmp_path / "nope")])
    assert exc.value.code == 2
    assert "--peer-binary" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no_such_field"):
        EngineConfig.from_json(json.dumps({"no_such_field": 1}))
    with pytest.raises(ValueError, match="KEY=VALUE"):
        peer.engine_config_dict(peer.build_parser().parse_args(["--engine-option", "x"]))


def test_engine_options_pass_through_to_the_config():
    args = peer.build_parser().parse_args(
        ["--seats", "4", "--max-model-len", "256", "--weights", "gguf",
         "--engine-option", "pack_weights=false", "--engine-option", "attention_backend=torch"])
    cfg = peer.engine_config_dict(args)
    assert cfg["max_num_seqs"] == 4 and cfg["max_model_len"] == 256 and cfg["device"] == "cpu"
    assert cfg["weights"] == "gguf"  # whatever this checkout's EngineConfig makes of it
    assert cfg["pack_weights"] is False and cfg["attention_backend"] == "torch"
    del cfg["weights"]
    assert EngineConfig.from_json(json.dumps(cfg)).pack_weights is False


def test_llama_server_gets_a_slot_per_seat_and_the_engines_threads():
    cmd = peer.llama_server_command("/x/llama-server", "/m.gguf", 8123, seats=16,
                                    max_model_len=512, threads=2, extra=["--foo"])
    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert cmd[0] == "/x/llama-server" and "-cb" in cmd and cmd[-1] == "--foo"
    assert value("-m") == "/m.gguf" and value("--host") == "127.0.0.1"
    assert value("--port") == "8123" and value("-np") == "16" and value("-c") == "8192"
    assert value("-t") == value("-tb") == "2"


def test_usage_counts_tokens_when_the_server_streams_text_without_ids():
    # llama.cpp's chunks: text only, one token held back; usage has the true count
    text_only = UserResult("a", asked_tokens=10, tokens=9, usage_tokens=10, sent=0.0,
                           first=1.0, end=2.8, chunk_times=[1.0, 2.8])
    # ServeLab's chunks carry token ids: those must agree with usage to count as exact
    ids_short = UserResult("b", asked_tokens=10, tokens=9, usage_tokens=10, streamed_ids=True,
                           sent=0.0, first=1.0, end=2.0, chunk_times=[1.0, 2.0])
    s = summarize([text_only, ids_short], wall=4.0, before={}, after={})
    assert s["output_tokens"] == 20 and s["exact_tokens"] == 1
    assert s["tpot_p50_s"] == pytest.approx((1.8 / 9 + 1.0 / 9) / 2)


def test_measure_a_fake_llama_server_end_to_end(fake_binary, tmp_path):
    port = peer.free_port()
    cmd = peer.llama_server_command(fake_binary, str(tmp_path / "model.gguf"), port, seats=4,
                                    max_model_len=256, threads=2)
    server = peer.ServerProcess("llama-server", cmd, port, tmp_path / "logs" / "fake.log",
                                startup_timeout_s=30)
    items = get_workload("longtail", n=6, max_tokens_scale=0.25).items
    res = peer.measure_server(server, items, decode_tokens=24, rounds=2, seats=4, timeout_s=60,
                              extra_body=peer.PEER_EXTRA_BODY["llama-server"])
    assert server.proc.poll() is not None, "the server must be stopped by its pid"
    w = res["workload"]
    assert w["outcomes"] == {"ok": 6} and w["exact_tokens"] == 6
    assert w["output_tokens"] == sum(it.max_tokens for it in items)
    assert len(res["decode_b1"]["rounds_tok_per_s"]) == 2
    assert res["decode_b1"]["tok_per_s"] == max(res["decode_b1"]["rounds_tok_per_s"]) > 0
    assert res["system_info"] == "n_threads = 2 | FAKE = 1 |"
    log = [json.loads(line) for line in server.log_text().splitlines() if line.startswith("{")]
    assert log[0]["argv"] == cmd[1:]
    asked = [e["request"]["max_tokens"] for e in log[1:]]
    # warm-up (a full batch of 4-token answers), 2 batch-1 rounds, then the workload
    assert asked[:4] == [4] * 4 and asked[4:6] == [24, 24]
    assert sorted(asked[6:]) == sorted(it.max_tokens for it in items)


def test_servers_take_turns_in_alternating_order_each_a_fresh_start(fake_binary, tmp_path):
    """Two servers, three rounds: A B, B A, A B, each turn a new process; batch 1 is the best
    turn, the workload the median turn, and every turn is kept."""
    started: list[str] = []

    def side(name: str):
        def make():
            started.append(name)
            port = peer.free_port()
            cmd = peer.llama_server_command(fake_binary, str(tmp_path / "m.gguf"), port, seats=4,
                                            max_model_len=256, threads=2)
            return peer.ServerProcess(name, cmd, port, tmp_path / f"{name}.log",
                                      startup_timeout_s=30)
        return name, make, peer.PEER_EXTRA_BODY["llama-server"]

    items = get_workload("longtail", n=4, max_tokens_scale=0.25).items
    res = peer.measure_in_turns([side("A"), side("B")], items, decode_tokens=8, rounds=3,
                                seats=4, timeout_s=60)
    assert started == ["A", "B", "B", "A", "A", "B"]
    for name in ("A", "B"):
        r = res[name]
        turns = r["turns"]
        assert len(turns) == 3
        assert r["decode_b1"]["tok_per_s"] == max(t["decode_b1_tok_per_s"] for t in turns)
        assert r["decode_b1"]["rounds_tok_per_s"] == [t["decode_b1_tok_per_s"] for t in turns]
        tps = sorted(t["output_tok_per_s"] for t in turns)
        assert r["workload"]["output_tok_per_s"] == tps[1], "the median turn's workload"
        assert r["workload"]["exact_tokens"] == len(items)
        assert r["system_info"] == "n_threads = 2 | FAKE = 1 |"


def test_a_server_that_dies_at_start_is_reported_with_its_log(fake_binary, tmp_path):
    port = peer.free_port()
    server = peer.ServerProcess("llama-server", [fake_binary, "--fail-at-start"], port,
                                tmp_path / "fail.log", startup_timeout_s=30)
    with pytest.raises(RuntimeError, match="(?s)exited with code 3.*failed to load model"):
        server.start()
    assert server.proc.poll() == 3


def test_the_peer_alone_writes_its_json_and_the_table_keeps_empty_columns(
        fake_binary, tmp_path, capsys):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    out = tmp_path / "peer.json"
    rc = peer.main(["--peer-binary", fake_binary, "--model-file", str(model), "--quick",
                    "--skip-engine", "--skip-offline", "--seats", "4", "--max-model-len", "256",
                    "--log-dir", str(tmp_path / "logs"), "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["peer"]["version"] == "version: 1234 (fake0) / built with fake-cc for test"
    assert data["results"]["engine_http"] is None
    assert data["results"]["peer_http"]["workload"]["users"] == 8
    assert data["ratios"]["decode_b1_engine_over_peer"] is None
    text = capsys.readouterr().out
    assert "batch-1 decode, tok/s" in text and "llama-server" in text

    assert data["kernel_paths"]["engine"]["plan"] == data["plan"]
    assert data["kernel_paths"]["engine"]["describe"] == data["plan"]["describe"]
    assert data["kernel_paths"]["peer"]["system_info"] == "n_threads = 2 | FAKE = 1 |"
    assert data["kernel_paths"]["peer"]["backends"] == {"CPU": {"FAKE": "1"}}


def test_a_peer_that_writes_its_system_info_only_at_trace_level_is_probed(
        fake_binary, tmp_path, monkeypatch):
    """llama.cpp b11434 writes its system info line only with -lv 4: the serving run's log has
    none, so a short start of its own with -lv 4 reads it, and that start is stopped."""
    monkeypatch.setenv("FAKE_INFO_AT_TRACE", "1")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    out, logs = tmp_path / "peer.json", tmp_path / "logs"
    rc = peer.main(["--peer-binary", fake_binary, "--model-file", str(model), "--quick",
                    "--skip-engine", "--skip-offline", "--seats", "4", "--max-model-len", "256",
                    "--threads", "2", "--log-dir", str(logs), "--out", str(out)])
    assert rc == 0
    assert "system_info" not in (logs / "llama-server.log").read_text(), "served quietly"
    data = json.loads(out.read_text())
    assert data["results"]["peer_http"]["system_info_from"] == "a start with -lv 4"
    assert data["kernel_paths"]["peer"]["system_info"] == "n_threads = 2 | FAKE = 1 |"
    argv = json.loads((logs / "system-info-probe.log").read_text().splitlines()[0])["argv"]
    assert argv[argv.index("-lv") + 1] == "4" and argv[argv.index("-m") + 1] == str(model)
    # the probe is gone: nothing listens on its port any more
    port = int(argv[argv.index("--port") + 1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_the_engine_and_the_peer_side_by_side_each_get_only_their_own_fields(
        fake_binary, tmp_path):
    """The peer's extra field (llama-server's `cache_prompt`) goes to the peer alone: the
    engine's server refuses fields it does not know, so sending it there fails the run. A
    --baseline-option runs a second engine.serve with that field changed in the same turns,
    and --baseline-checkout runs that one from another checkout's code."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    # another checkout: this one's packages, its server marked so its log shows whose code ran
    other = tmp_path / "other"
    for pkg in ("engine", "benchmarks", "lessons", "app"):
        shutil.copytree(peer.ROOT / pkg, other / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    serve = other / "engine" / "serve.py"
    text = serve.read_text()
    assert text.count("seats; serving {") == 1
    serve.write_text(text.replace("seats; serving {", "seats; the other checkout serving {"))
    out = tmp_path / "peer.json"
    rc = peer.main(["--peer-binary", fake_binary, "--model-file", str(model), "--quick",
                    "--skip-offline", "--seats", "4", "--max-model-len", "256", "--rounds", "1",
                    "--baseline-option", "kv_cache_dtype=float32",
                    "--baseline-checkout", str(other),
                    "--log-dir", str(tmp_path / "logs"), "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    engine, base = data["results"]["engine_http"], data["results"]["baseline_http"]
    for side in (engine, base):
        assert side["workload"]["ok"] == side["workload"]["users"] == 8, side["workload"]
    assert data["ratios"]["output_tok_per_s_engine_over_peer"] is not None
    assert data["ratios"]["output_tok_per_s_engine_over_baseline"] is not None
    assert data["baseline_config"] == {**data["engine_config"], "kv_cache_dtype": "float32"}
    assert base["system"] == "engine.serve baseline"
    assert "the other checkout serving" in (tmp_path / "logs" / "engine.serve-baseline.log"
                                             ).read_text()
    assert "the other checkout" not in (tmp_path / "logs" / "engine.serve.log").read_text()
    assert data["baseline_checkout"]["path"] == str(other.resolve())


def test_a_baseline_checkout_that_is_none_is_refused(tmp_path):
    """--baseline-checkout names a directory without this repository's `engine.serve
    --engine-config`: the command stops with a message naming it, before any server starts.
    An earlier checkout, with `benchmarks/serve_config.py` instead, is served that way."""
    with pytest.raises(ValueError, match="--baseline-checkout .*no engine/serve.py with "
                                         "--engine-config"):
        peer.baseline_checkout(str(tmp_path))
    cfg = {"max_num_seqs": 4}
    cmd = peer.engine_server_command(cfg, 8123)
    assert cmd[1:4] == ["-m", "engine.serve", "--engine-config"]
    assert EngineConfig.from_json(cmd[4]) == EngineConfig(max_num_seqs=4)
    old = tmp_path / "old"
    (old / "benchmarks").mkdir(parents=True)
    (old / "benchmarks" / "serve_config.py").write_text("")
    assert peer.baseline_checkout(str(old))["path"] == str(old.resolve())
    assert peer.engine_server_command(cfg, 8123, old)[1:3] == ["-m", "benchmarks.serve_config"]
    assert peer.baseline_checkout(None) is None
    here = peer.baseline_checkout(str(peer.ROOT))
    # a clone has its commit; a copy without .git (or a git that refuses it) says so
    assert here["path"] == str(peer.ROOT)
    assert len(here["commit"]) == 40 or here["commit"].startswith("unknown"), here


# llama.cpp's line as common_params_get_system_info and llama_print_system_info write it:
# "system_info: n_threads = T (n_threads_batch = B) / hardware threads | " then, per backend
# that lists features, "NAME : FEATURE = VALUE | " for each feature (ggml-cpu's names)
LLAMA_CPP_LINE = ("main: system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | "
                  "SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
                  "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | "
                  "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
# an older build: no n_threads_batch, features without a backend name, zeros listed
LLAMA_CPP_OLD_LINE = ("system_info: n_threads = 4 / 8 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | "
                      "FMA = 1 | NEON = 0 | F16C = 1 | BLAS = 0 | SSE3 = 1 | VSX = 0 | ")


def test_parse_llama_cpp_system_info_line():
    info = peer.system_info("llama server listening\n" + LLAMA_CPP_LINE + "\nmore log\n")
    assert info.startswith("n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1")
    got = peer.parse_system_info(info)
    assert (got["n_threads"], got["n_threads_batch"], got["hardware_threads"]) == (2, 2, 2)
    assert list(got["backends"]) == ["CPU"]
    assert got["backends"]["CPU"]["SSE3"] == "1" and got["backends"]["CPU"]["REPACK"] == "1"
    assert len(got["backends"]["CPU"]) == 15
    assert {"AVX512_VNNI", "AMX_INT8", "AVX512_BF16", "OPENMP"} <= set(got["features"])
    assert peer.parse_system_info(LLAMA_CPP_LINE) == got  # the prefix is optional

    old = peer.parse_system_info(LLAMA_CPP_OLD_LINE)
    assert (old["n_threads"], old["n_threads_batch"], old["hardware_threads"]) == (4, None, 8)
    assert old["backends"]["CPU"]["AVX512"] == "0"
    assert old["features"] == ["AVX", "AVX2", "F16C", "FMA", "SSE3"]  # the zeros are not used

    two = peer.parse_system_info("n_threads = 8 / 16 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 | "
                                 "CPU : AVX2 = 1 | SVE_CNT = 32 | ")
    assert two["backends"] == {"CUDA": {"ARCHS": "890", "USE_GRAPHS": "1"},
                               "CPU": {"AVX2": "1", "SVE_CNT": "32"}}


def test_kernel_paths_record_the_engines_plan_and_the_peers_line():
    from engine.config import EngineConfig
    from engine.plan import MachineFacts, resolve_plan

    plan = resolve_plan(EngineConfig(), MachineFacts.of(cpu_flags={"avx2", "fma", "f16c"}))
    kp = peer.kernel_paths(plan, {"system_info": peer.system_info(LLAMA_CPP_LINE)})
    assert kp["engine"]["plan"]["layout"] == plan.layout and kp["engine"]["describe"] == str(plan)
    assert kp["peer"]["system_info"].endswith("REPACK = 1 |")
    assert "AMX_INT8" in kp["peer"]["features"]
    assert peer.kernel_paths(plan, {"decode_b1": {}})["peer"] is None
    json.dumps(kp)  # the JSON takes it as it is


def test_comparison_table_ratios():
    def http(decode, tps, ttft, cpu):
        return {"decode_b1": {"tok_per_s": decode},
                "workload": {"output_tok_per_s": tps, "ttft_p50_s": ttft, "exact_tokens": 32,
                             "users": 32}, "tok_per_server_cpu_s": cpu}

    engine = http(60.0, 500.0, 0.5, 250.0)
    llama = http(120.0, 200.0, 1.0, 100.0)
    offline = {"decode_b1": {"tok_per_s": 72.0},
               "workload": {"output_tok_per_s": 540.0, "ttft_p50_s": 0.4, "output_tokens": 1298},
               "tok_per_cpu_s": 270.0}
    rows, ratios = peer.comparison(engine, llama, offline)
    assert ratios["decode_b1_engine_over_peer"] == pytest.approx(0.5)
    assert ratios["decode_b1_offline_over_peer"] == pytest.approx(0.6)
    assert ratios["output_tok_per_s_engine_over_peer"] == pytest.approx(2.5)
    assert ratios["tok_per_cpu_s_offline_over_peer"] == pytest.approx(2.7)
    assert rows[0] == ["", "engine.serve", "llama-server", "ratio", "engine offline", "ratio"]
    assert rows[1] == ["batch-1 decode, tok/s", "60.0", "120.0", "0.50x", "72.0", "0.60x"]
    assert rows[2][3] == "2.50x" and rows[-1][1:3] == ["32/32", "32/32"]
    table = peer.format_table(rows)
    assert len(table.splitlines()) == len(rows)
    rows, ratios = peer.comparison(None, llama, None)
    assert rows[1] == ["batch-1 decode, tok/s", "-", "120.0", "-", "-", "-"]
    assert ratios["output_tok_per_s_engine_over_peer"] is None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("llama-server") is None,
                    reason="no llama-server on PATH (docs/performance.md: how to build it)")
def test_real_llama_server_on_the_bundled_model(tmp_path):
    from engine.model.loader import _bundled_gguf

    port = peer.free_port()
    # -nr (no weight repacking): llama.cpp b11434's AMX matmul stopped with SIGILL on the
    # development machine (docs/performance.md); this test checks the protocol, not speed
    cmd = peer.llama_server_command(shutil.which("llama-server"),
                                    str(_bundled_gguf("smollm2-135m")), port, seats=4,
                                    max_model_len=256, threads=peer.cpu_count(), extra=["-nr"])
    server = peer.ServerProcess("llama-server", cmd, port, tmp_path / "llama.log",
                                startup_timeout_s=120)
    items = get_workload("longtail", n=4, max_tokens_scale=0.25).items
    res = peer.measure_server(server, items, decode_tokens=16, rounds=1, seats=4,
                              timeout_s=300, extra_body=peer.PEER_EXTRA_BODY["llama-server"])
    assert server.proc.poll() is not None
    assert res["workload"]["exact_tokens"] == 4, res["workload"]
    assert res["workload"]["output_tokens"] == sum(it.max_tokens for it in items)
    assert res["decode_b1"]["tok_per_s"] > 0


def test_pooled_runs_take_the_medians_over_every_turn(tmp_path, capsys):
    """--pool reads runs' JSONs and pools their turns: each side's median over all turns,
    the medians' ratio and the range of turn-by-turn ratios; a file without both sides'
    turns is refused with its name, and nothing is measured (no binary is needed)."""
    def run(path, engine, peer_rates):
        turns = {name: [{"decode_b1_tok_per_s": b1, "output_tok_per_s": wl, "server_cpu_s": 1.0}
                        for b1, wl in rates]
                 for name, rates in (("engine_http", engine), ("peer_http", peer_rates))}
        path.write_text(json.dumps({"results": {k: {"turns": v} for k, v in turns.items()}}))
        return str(path)

    a = run(tmp_path / "a.json", [(200, 400), (210, 500)], [(100, 100), (100, 125)])
    b = run(tmp_path / "b.json", [(190, 300), (220, 450), (230, 480)],
            [(120, 100), (110, 110), (105, 100)])
    pooled = peer.pool_runs([a, b])
    assert pooled["runs"] == 2 and pooled["turns"] == 5
    assert pooled["engine_http"] == {"decode_b1_tok_per_s": 210, "output_tok_per_s": 450}
    assert pooled["peer_http"] == {"decode_b1_tok_per_s": 105, "output_tok_per_s": 100}
    assert pooled["output_tok_per_s_engine_over_peer"] == 4.5
    assert pooled["decode_b1_engine_over_peer"] == 2.0
    assert pooled["turn_ratios"] == [3.0, 4.8]  # 300 / 100 and 480 / 100
    assert peer.main(["--pool", a, b, "--peer-binary", str(tmp_path / "none")]) == 0
    assert "2 runs, 5 turns a side" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": {"engine_http": None}}))
    with pytest.raises(ValueError, match="bad.json: not a peer bench JSON"):
        peer.pool_runs([a, str(bad)])
    empty = run(tmp_path / "empty.json", [], [])
    with pytest.raises(ValueError, match="empty.json: no turns"):
        peer.pool_runs([empty])
    with pytest.raises(SystemExit):
        peer.main(["--pool", str(bad)])
    assert "bad.json" in capsys.readouterr().err
