"""`python -m benchmarks.apprentice_score [HEAD ...]`: how often EAGLE heads guess right on
the benchmark's own prompts, and what prompt lookup in front of them adds.

The target answers the 12 `grounded` and 12 `open` prompts of `benchmarks/workloads.py`
(greedy, up to 128 tokens; never in the training set, tests/engine/test_spec_eagle.py),
recording its features as it decodes (`train_draft.generate`). Then, teacher-forced:

1. per head file (default: the one in the cache): the fraction of answer positions where the
   head's first 1, 2, 3, 4 drafts are all right (`train_draft.agreement`, the same measure
   as the trainer's held-out score, on these prompts instead);
2. for the first head, the first draft right under lookup policies: the head alone; prompt
   lookup on a match of `m`-4 tokens, else the head (`SpecConfig(prompt_lookup_first=True)`
   with `prompt_lookup_min = m`); and the head wherever its own probability is at least
   `tau`, else lookup where it matches (`policy_hits`).

Heads to compare come from `python -m engine.spec.train_draft --out PATH` with other flags
(`--no-soft`, `--lr`). No timing here: the bench (`--spec`) measures speed.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.workloads import GROUNDED, OPEN
from engine import EngineConfig, LLMEngine

POLICIES = ("head", "lookup1", "lookup2", "lookup3", "head>=0.7")


def policy_hits(seq: list[int], prompt_len: int, head_tok: list[int], head_p: list[float],
                ) -> dict[str, list[bool]]:
    """Per answer position j + 2 (drafted after tokens 0..j + 1): is the first draft right,
    under each of POLICIES? head_tok[j] / head_p[j]: the head's draft and its probability
    after position j (teacher-forced)."""
    from engine.spec.ngram import propose_ngram

    out: dict[str, list[bool]] = {p: [] for p in POLICIES}
    for j in range(max(prompt_len - 2, 0), len(seq) - 2):
        want, head = seq[j + 2], head_tok[j] == seq[j + 2]
        ctx = seq[: j + 2]
        out["head"].append(head)
        for m in (1, 2, 3):
            lk = propose_ngram(ctx, 1, m, 4)
            out[f"lookup{m}"].append(lk[0] == want if lk else head)
        lk = propose_ngram(ctx, 1, 2, 4)
        out["head>=0.7"].append(head if (not lk or head_p[j] >= 0.7) else lk[0] == want)
    return out


@torch.inference_mode()
def head_drafts(engine, weights: dict, seq: list[int], feats: torch.Tensor,
                ) -> tuple[list[int], list[float]]:
    """The head's first draft and its probability after every position (teacher-forced)."""
    from engine.spec.eagle import WEIGHT_NAMES, rope_tables, train_forward

    loaded = engine.model.loaded.weights
    embed = loaded["embed_tokens.weight"].float()
    readout = loaded.get("lm_head.weight", loaded["embed_tokens.weight"]).float()[
        weights["vocab"]]
    w = {n: weights[n].float() for n in WEIGHT_NAMES}
    n = len(seq) - 1
    cos, sin = rope_tables(engine.model.cfg, n)
    pred = train_forward(w, engine.model.cfg, feats[:n].float()[None],
                         embed[torch.tensor(seq[1:n + 1])][None], cos, sin)[0]
    p, idx = torch.softmax(pred @ readout.T, dim=-1).max(dim=-1)
    return weights["vocab"][idx].tolist(), p.tolist()


def main(argv: list[str] | None = None) -> int:
    from engine.spec import train_draft as td
    from engine.spec.eagle import head_path, load_weights

    ap = argparse.ArgumentParser(prog="python -m benchmarks.apprentice_score",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("heads", nargs="*", help="head files (default: the trained one)")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    heads = args.heads or [str(head_path())]
    engine = LLMEngine(EngineConfig(max_num_seqs=len(GROUNDED) + len(OPEN), max_model_len=512))
    data = {}
    for name, prompts in (("grounded", GROUNDED), ("open", OPEN)):
        items = [{"kind": name, "prompt": p, "max_tokens": args.max_tokens} for p, _ in prompts]
        seqs, feats, _ = td.generate(engine, items, lambda n: None)
        lens = [len(engine.tokenizer.encode(td.chat(it["prompt"]), add_special_tokens=False))
                for it in items]
        data[name] = (seqs, feats, lens)
    for path in heads:
        weights, _ = load_weights(path)
        chains = {name: td.agreement(engine.model, weights, *d) for name, d in data.items()}
        print(f"{path}: first 1..4 drafts all right: " + " | ".join(
            f"{name} {' '.join(f'{c:.3f}' for c in ch)}" for name, ch in chains.items()))
    weights, _ = load_weights(heads[0])
    for name, (seqs, feats, lens) in data.items():
        hits: dict[str, list[bool]] = {p: [] for p in POLICIES}
        for s, f, p in zip(seqs, feats, lens):
            for k, v in policy_hits(s, p, *head_drafts(engine, weights, s, f)).items():
                hits[k] += v
        print(f"{name}, first draft right by policy: " + ", ".join(
            f"{k} {sum(v) / max(len(v), 1):.3f}" for k, v in hits.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
