"""A real third-party evaluator end to end: lm-eval's `local-completions` model scores a small
multiple-choice task of our own (tests/lmeval/: 20 items) through the server's echo +
logprobs, and gets the same log-likelihoods, so the same accuracy, as transformers computes
offline for the same token split."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.conftest import running_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a request into context and continuation tokens (TemplateLM's
    `_encode_pair`): trailing spaces move to the continuation, the whole is encoded once."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctx = tok(context, add_special_tokens=False).input_ids
    return ctx, whole[len(ctx):]


def test_lm_eval_local_completions_matches_offline(engine, tmp_path, monkeypatch):
    # the datasets library keeps its cache where the test says, offline
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from benchmarks.baseline import load_hf
    from engine.model.loader import hf_folder

    src = __import__("pathlib").Path(__file__).resolve().parents[2] / "lmeval"
    task_dir = tmp_path / "tasks"
    task_dir.mkdir()
    shutil.copy(src / "questions.jsonl", task_dir / "questions.jsonl")
    yaml = (src / "servelab_mc.yaml").read_text().replace(
        "test: questions.jsonl", f"test: {task_dir / 'questions.jsonl'}")
    (task_dir / "servelab_mc.yaml").write_text(yaml)

    folder = str(hf_folder(MODEL))
    with running_server(engine) as (url, _):
        out = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={"model": MODEL, "base_url": f"{url}/v1/completions",
                        "tokenizer": folder, "tokenizer_backend": "huggingface",
                        "tokenized_requests": True, "num_concurrent": 1, "max_retries": 1},
            tasks=["servelab_mc"], task_manager=TaskManager(include_path=str(task_dir)),
            log_samples=True, bootstrap_iters=0)
    acc = out["results"]["servelab_mc"]["acc,none"]
    samples = out["samples"]["servelab_mc"]
    assert len(samples) == 20

    hf, tok = load_hf(MODEL)
    correct = 0
    for s in samples:
        offline = []
        for (context, continuation), resp in zip(s["arguments"], s["resps"]):
            ctx, cont = encode_pair(tok, context, continuation)
            ids = torch.tensor([ctx + cont])
            with torch.no_grad():
                lp = torch.log_softmax(hf(ids).logits[0].float(), -1)
            ll = sum(lp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))
            assert resp[0][0] == pytest.approx(ll, abs=2e-3), (context, continuation)
            offline.append(ll)
        correct += int(max(range(len(offline)), key=offline.__getitem__) == int(s["target"]))
    assert acc == correct / 20
    assert acc >= 0.5  # the model knows most of these facts: the answers are read, not noise
