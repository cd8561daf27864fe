"""`--model ORG/NAME`: a model by its Hub id, downloaded through huggingface_hub from
HF_ENDPOINT (here a fake Hub: a local HTTP server in this test that answers the routes
huggingface_hub calls, serving a tiny random Qwen2 written by transformers). The downloaded
model gives transformers' greedy tokens; a second start reads the cache with the server gone
(and with HF_HUB_OFFLINE); an unsupported architecture is refused before any weight file is
asked for; a missing repository, an unreachable endpoint and a ModelScope id without its
client each get a message that says what to do."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import importlib.util
import json
import threading
import time
import types
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model import hub
from engine.model.loader import ModelLoadError, hf_folder, is_loaded
from tests.conftest import free_port, write_tiny_qwen2

REPO = "tiny-org/tiny-qwen2"


class FakeHub:
    """The Hub's download routes over `repos` ({repo id: {file name: bytes}}), on 127.0.0.1.
    `requests` logs every (method, path) it was asked, so a test can say what was fetched."""

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self.port = free_port()
        hub_ = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # the log is `requests`, not stderr
                pass

            def do_HEAD(self):
                hub_.answer(self, head=True)

            def do_GET(self):
                hub_.answer(self, head=False)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def commit(files: dict[str, bytes]) -> str:
        h = hashlib.sha1()
        for name in sorted(files):
            h.update(name.encode() + hashlib.sha1(files[name]).digest())
        return h.hexdigest()

    def files_asked(self) -> list[str]:
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for _, p in self.requests
                if "/resolve/" in p]

    def answer(self, req, head: bool) -> None:
        path = unquote(urlsplit(req.path).path)
        self.requests.append((req.command, path))
        if path.startswith("/api/models/"):
            rest = path.removeprefix("/api/models/")
            repo, sep, tail = self._split_repo(rest)
            if repo is None:
                return self._not_found(req, "RepoNotFound")
            files = self.repos[repo]
            if tail.startswith("revision/"):
                body = {"id": repo, "modelId": repo, "sha": self.commit(files), "private": False,
                        "siblings": [{"rfilename": f} for f in sorted(files)]}
            elif tail.startswith("tree/"):
                body = [{"type": "file", "path": f, "size": len(b),
                         "oid": hashlib.sha1(b).hexdigest()} for f, b in sorted(files.items())]
            else:
                return self._not_found(req, None)
            return self._send(req, json.dumps(body).encode(), head, {
                "Content-Type": "application/json"})
        repo, sep, tail = self._split_repo(path.lstrip("/"))
        if repo is None:
            return self._not_found(req, "RepoNotFound")
        if not tail.startswith("resolve/"):
            return self._not_found(req, None)
        _rev, _, filename = tail.removeprefix("resolve/").partition("/")
        files = self.repos[repo]
        if filename not in files:
            return self._not_found(req, "EntryNotFound")
        data = files[filename]
        headers = {"X-Repo-Commit": self.commit(files),
                   "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                   "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        start = 0
        rng = req.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
            start = int(rng[6:].split("-")[0])
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        return self._send(req, data[start:], head, headers, status=206 if start else 200)

    def _split_repo(self, rest: str):
        parts = rest.split("/", 2)
        if len(parts) < 2:
            return None, "", ""
        repo = f"{parts[0]}/{parts[1]}"
        if repo not in self.repos:
            return None, "", ""
        return repo, "/", parts[2] if len(parts) > 2 else ""

    @staticmethod
    def _send(req, body: bytes, head: bool, headers: dict, status: int = 200) -> None:
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if not head:
            req.wfile.write(body)

    @staticmethod
    def _not_found(req, code: str | None) -> None:
        body = json.dumps({"error": "not found"}).encode()
        req.send_response(404)
        if code:
            req.send_header("X-Error-Code", code)
            req.send_header("X-Error-Message", f"{code}: not on this fake hub")
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(body)

    def start(self) -> FakeHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@contextlib.contextmanager
def fake_hub(repos):
    server = FakeHub(repos).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tiny_repos(tmp_path_factory):
    """The tiny Qwen2 (and the transformers model that wrote it) as a repository's files,
    with files the engine must never fetch beside it, and two repositories it must refuse."""
    out = tmp_path_factory.mktemp("tiny-qwen2")
    model = write_tiny_qwen2(out)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    files["pytorch_model.bin"] = b"pickle: never fetched"
    files["model.gguf"] = b"GGUF: never fetched"
    files["onnx/model.safetensors"] = b"a subfolder: never fetched"
    gpt2_cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2}
    pickle_only = {k: v for k, v in files.items() if not k.endswith(".safetensors")}
    repos = {
        REPO: files,
        "tiny-org/tiny-gpt2": {"config.json": json.dumps(gpt2_cfg).encode(),
                               "model.safetensors": files["model.safetensors"]},
        "tiny-org/pickle-only": {**pickle_only, "onnx/model.safetensors": b"not top level"},
    }
    return repos, model


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """An empty Hugging Face cache of this test's own, and no flag left from the shell."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "HF_TOKEN", "HF_HUB_DISABLE_XET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub, "_resolved", {})  # each test resolves afresh
    return tmp_path / "hf-home" / "hub"


def test_a_hub_id_downloads_loads_and_matches_transformers(tiny_repos, hub_env, monkeypatch):
    repos, model = tiny_repos
    with fake_hub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        eng = LLMEngine(EngineConfig(model=REPO, dtype="float32", cpu_kernels=False,
                                     max_num_seqs=2, num_kv_blocks=16, max_model_len=64))
        asked = server.files_asked()
    folder = hf_folder(REPO)  # this process's resolve: no network, the same snapshot
    assert is_loaded(REPO, torch.float32)  # the app's "already loaded?" finds it by its id
    assert folder.is_relative_to(hub_env) and (folder / "model.safetensors").is_file()
    assert asked and all(not f.endswith((".bin", ".gguf")) and "/" not in f for f in asked)
    assert not (folder / "pytorch_model.bin").exists() and not (folder / "onnx").exists()
    prompts = [[5, 17, 923, 44, 1200, 7], [300, 301, 302]]
    outs = eng.generate(prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        assert out.token_ids == ref[0, len(prompt):].tolist()


def test_the_cache_serves_a_second_start_without_the_server(tiny_repos, hub_env, monkeypatch):
    repos, _ = tiny_repos
    with fake_hub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        first = hf_folder(REPO)
    # the server is stopped: its port refuses, and a fresh process-level resolve must not ask
    monkeypatch.setattr(hub, "_resolved", {})
    assert hf_folder(REPO) == first
    monkeypatch.setattr(hub, "_resolved", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hf_folder(REPO) == first


def test_an_unsupported_architecture_is_refused_before_any_weight_file(
        tiny_repos, hub_env, monkeypatch):
    repos, _ = tiny_repos
    with fake_hub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(ModelLoadError, match="unsupported architecture 'GPT2LMHeadModel'"):
            hf_folder("tiny-org/tiny-gpt2")
        asked = server.files_asked()
    assert asked == ["config.json"] * len(asked) and asked
    assert not any(hub_env.rglob("*.safetensors"))


def test_a_repo_without_safetensors_is_refused_and_no_pickle_fetched(
        tiny_repos, hub_env, monkeypatch):
    repos, _ = tiny_repos
    with fake_hub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights"):
            hf_folder("tiny-org/pickle-only")
        asked = server.files_asked()
    assert not any(f.endswith((".bin", ".gguf", ".safetensors")) for f in asked)


def test_a_missing_repo_names_the_id_the_endpoint_and_hf_token(tiny_repos, hub_env, monkeypatch):
    repos, _ = tiny_repos
    with fake_hub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(ModelLoadError) as err:
            LLMEngine(EngineConfig(model="tiny-org/no-such-model"))
    msg = str(err.value)
    assert "'tiny-org/no-such-model'" in msg and server.url in msg and "not found" in msg
    assert "HF_TOKEN" in msg


def test_an_unreachable_endpoint_with_an_empty_cache_suggests_a_mirror(hub_env, monkeypatch):
    from huggingface_hub.utils import _http

    # huggingface_hub retries a refused connection a bounded number of times with a growing
    # wait (a real network blip); the waits are no part of what this test checks
    waits: list[float] = []
    monkeypatch.setattr(_http, "time", types.SimpleNamespace(**{**vars(time),
                                                                "sleep": waits.append}))
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", closed)
    with pytest.raises(ModelLoadError) as err:
        hf_folder(REPO)
    msg = str(err.value)
    assert closed in msg and "HF_ENDPOINT=https://hf-mirror.com" in msg and REPO in msg
    assert "not" in msg and str(hub_env) in msg  # it says the cache lacks the model, and where


def test_offline_with_an_empty_cache_says_so(hub_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE") as err:
        hf_folder(REPO)
    assert str(hub_env) in str(err.value)


@pytest.mark.skipif(importlib.util.find_spec("modelscope") is not None,
                    reason="modelscope is installed: its missing-client message cannot show")
def test_modelscope_without_its_client_says_pip_install(hub_env):
    with pytest.raises(ModelLoadError, match="pip install modelscope"):
        hf_folder("modelscope:x/y")


@pytest.mark.parametrize("name,remote", [
    ("Qwen/Qwen2.5-0.5B-Instruct", True), ("HuggingFaceTB/SmolLM2-135M", True),
    ("a/b/c", False), ("-a/b", False), ("a--b/c", False), ("a/b.", False), ("noslash", False),
    ("a/..", False), ("modelscope:Qwen/Qwen2.5-0.5B-Instruct", True),
])
def test_which_names_are_hub_ids(name, remote):
    assert hub.is_remote_name(name) is remote


def test_a_name_that_is_no_path_and_no_hub_id_is_unknown(hub_env, tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model"):
        hf_folder(str(Path("no") / "such" / "folder"))


# Qwen2.5-Instruct's chat template (its tokenizer_config.json), without the tool-calling
# branches: its own default system line, ChatML turns
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content']"
    " + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages "
    "%}{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant') %}{{- '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- "
    "'<|im_start|>assistant\\n' }}{%- endif %}")


def test_a_chinese_question_to_a_hub_model_gets_that_models_chat_template(
        tiny_repos, hub_env, monkeypatch):
    """A student's question, in Chinese, to the class server running a model fetched by its Hub
    id: the prompt is the model's own chat template around the question (Qwen's system line,
    not the bundled model's), and the answer streams to its end."""
    import httpx
    from transformers import AutoTokenizer

    from engine.server import ServerSettings
    from tests.classroom.test_student import ask, join
    from tests.conftest import running_server

    repos, _ = tiny_repos
    files = dict(repos[REPO])
    tok_cfg = json.loads(files["tokenizer_config.json"])
    tok_cfg["chat_template"] = QWEN_TEMPLATE
    files["tokenizer_config.json"] = json.dumps(tok_cfg).encode()
    files.pop("chat_template.jinja", None)  # the bundled model's, were it copied
    chat = "tiny-org/tiny-qwen2-chat"
    question = "你好，请用中文介绍一下自己。"
    with fake_hub({**repos, chat: files}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        eng = LLMEngine(EngineConfig(model=chat, dtype="float32", cpu_kernels=False,
                                     max_num_seqs=2, num_kv_blocks=32, max_model_len=256))
    want = eng.tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             add_generation_prompt=True, tokenize=False)
    assert want == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                    f"helpful assistant.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
                    "<|im_start|>assistant\n")
    bundled = AutoTokenizer.from_pretrained(hf_folder("smollm2-135m")).apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True)
    want_ids = eng.tokenizer.encode(want, add_special_tokens=False)
    assert len(want_ids) != len(bundled)  # the two templates tell apart by length
    settings = ServerSettings(api_key="join", admin_key="admin")
    with running_server(eng, settings) as (url, _), httpx.Client(base_url=url, timeout=60) as c:
        status, events = ask(c, "小明", question, code="join", phone=join(c, "join"))
    assert status == 200, events
    done = [e for e in events if e["type"] == "done"]
    assert done, events
    prompt_tokens = [e for e in events if e["type"] == "accepted"][0].get("prompt_tokens")
    if prompt_tokens is None:  # the count rides on the done event's usage
        prompt_tokens = done[0]["usage"]["prompt_tokens"]
    assert prompt_tokens == len(want_ids), (prompt_tokens, len(want_ids), len(bundled))
