"""`python -m engine.spec.train_draft`: train the apprentice (the EAGLE draft head) here.

Self-distillation on the target's own outputs (as EAGLE, Li et al. 2024, arXiv:2401.15077,
and FR-Spec, Zhao et al. 2025, arXiv:2502.14856; see `engine/spec/eagle.py`):

1. generate: the target answers the project's training prompts (`engine/spec/data/
   train_prompts.jsonl`, 206 hand-written, and `train_prompts_more.jsonl`, 416 generated
   from topic lists by `engine/spec/data/make_prompts.py`; all disjoint from the
   benchmark's `grounded` and `open` prompts), greedy, in batches, with the engine itself;
   with `--samples N` also N sampled answers per prompt (temperature 0.8, seeded, still
   labelled with the greedy next token). Distinct prompts are what the head lacks most:
   half of the hand-written prompts gave a held-out agreement of 0.37, all of them 0.46,
   three sampled answers more per prompt 0.47 (250 steps each). The same forwards that decode
   the answers record the target's final-normed hidden state at every position (the
   features the head reads and predicts) and its greedy next token there (the engine's
   `feature_observer`), so no second pass over the text is needed;
2. vocabulary: the `--vocab` tokens that appear most often in those sequences (FR-Spec);
3. start: the best linear head in closed form (`ridge_fc`: one least-squares solve), with
   the decoder layer's output projections at zero, so training starts where a linear
   predictor ends;
4. train: the head predicts f_{j+1} from (f_j, embed(token_{j+1})), loss = smooth-L1 on the
   feature + cross-entropy against the target's distribution after j + 1 (its softmax over
   the reduced vocabulary, `--soft`, the default; `--no-soft`: its greedy token), AdamW with a cosine schedule and a small learning rate (a large one
   unlearns the linear start: held-out agreement 0.31 -> 0.30 at 2e-3, -> 0.41 at 3e-4),
   seeded; a little noise on the input features (EAGLE's data augmentation), and the
   training-time test (`--depth`, EAGLE-3): each position is also unrolled a further draft
   step on the head's OWN predicted feature, with the attention the drafting chain has
   (`eagle.unrolled_forward`), because from the second drafted token on that is what the
   head reads;
5. write the weights (safetensors) to the ServeLab cache (`eagle.head_path()`), with the
   held-out agreement per draft position in the file's metadata (`held_out_chain`: the
   fraction of answer positions where the first 1, 2, 3, 4 drafts are all right).

Everything is seeded (`--seed`): the same command on the same machine writes the same head.
About 15 minutes on 2 CPU cores; `--quick` trains a small one in a minute or two.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

# the hand-written prompts, then the generated ones (`python -m engine.spec.data.make_prompts`:
# the same kinds and shapes on more topics; distinct prompts are what the head lacks most)
DATA = Path(__file__).parent / "data" / "train_prompts.jsonl"
DATA_MORE = DATA.with_name("train_prompts_more.jsonl")
DEPTH = 1  # draft steps trained per position (2+: the training-time test)
STEPS = 500
SAMPLES = 0  # sampled answers per prompt besides the greedy one
# distill the target's whole distribution (over the reduced vocabulary), not only its argmax:
# on the benchmark's prompts the first draft right 0.539 -> 0.564 grounded, 0.346 -> 0.363 open
SOFT = True
TEMPERATURE = 0.8
DATA_FORMAT = 2  # of the kept answers and features (2: recorded while decoding)


def load_prompts(*paths: Path) -> list[dict]:
    """The training prompts (default: DATA, then DATA_MORE): [{"kind", "prompt" (the user's
    text), "max_tokens"}]."""
    items = []
    for path in paths or (DATA, DATA_MORE):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            it = json.loads(line)
            if not isinstance(it.get("prompt"), str) or not isinstance(it.get("max_tokens"), int):
                raise ValueError(f"{path.name} line {i + 1}: needs 'prompt' and 'max_tokens'")
            items.append(it)
    return items


def chat(user: str) -> str:
    """SmolLM2's chat markup around one user turn (as benchmarks/workloads.py writes it; the
    engine does not import the benchmarks)."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def generate(engine, items: list[dict], progress, temperature: float = 0.0, seed: int = 0,
             ) -> tuple[list[list[int]], list[torch.Tensor], list[torch.Tensor]]:
    """The target's answers (greedy, or sampled at `temperature` with per-item seeds), and
    what the head learns from, recorded from the same forwards that decode them: per item,
    the token ids of prompt + answer, the target's final-normed hidden state at each of those
    positions [T, H] (bf16) and its greedy next token there [T] (the argmax of its logits).

    The answer's last token is dropped: the engine samples it but never feeds it back, so it
    has no feature. Recording while decoding saves a second forward over every sequence
    (`features`), about 40% of the data's cost; the kernels are batch-invariant, so a
    feature recorded in a decode step equals the one a whole-sequence forward gives."""
    from engine.config import SamplingParams

    def params(i: int, it: dict) -> SamplingParams:
        if not temperature:
            return SamplingParams(max_tokens=it["max_tokens"])
        return SamplingParams(max_tokens=it["max_tokens"], temperature=temperature,
                              seed=seed * 100003 + i)

    cap = engine.config.max_model_len
    hs = engine.model_config.hidden_size
    feats: dict[str, torch.Tensor] = {}
    labels: dict[str, torch.Tensor] = {}

    @torch.inference_mode()
    def record(fwd) -> None:  # every forward: its rows' features and greedy next tokens
        top = engine.model.logits(fwd.hidden).argmax(-1).cpu()
        h = fwd.hidden.to(torch.bfloat16).cpu()
        for req, start, row, n in fwd.spans:
            rid = req.request_id
            if rid not in feats:
                feats[rid] = torch.zeros(cap, hs, dtype=torch.bfloat16)
                labels[rid] = torch.zeros(cap, dtype=torch.long)
            feats[rid][start:start + n] = h[row:row + n]  # a recompute overwrites the same
            labels[rid][start:start + n] = top[row:row + n]

    keep = engine.runner.keep_hidden
    engine.runner.keep_hidden, engine.feature_observer = True, record
    try:
        rids = [engine.add_request(chat(it["prompt"]), params(i, it))
                for i, it in enumerate(items)]
        while engine.has_unfinished():
            progress(len(engine.step().finished))
    finally:
        engine.runner.keep_hidden, engine.feature_observer = keep, None
    seqs, fs, ls = [], [], []
    for r in rids:
        req = engine.requests[r]
        seq = (list(req.prompt_token_ids) + list(req.output_token_ids))[:-1]
        seqs.append(seq)
        fs.append(feats[r][:len(seq)].clone())
        ls.append(labels[r][:len(seq)].clone())
    return seqs, fs, ls


@torch.inference_mode()
def features(engine, seqs: list[list[int]], progress, batch_tokens: int = 2048,
             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """For each sequence: the target's final-normed hidden state at every position [T, H]
    (bf16) and its greedy next token there [T] (the argmax of its logits), several sequences
    per forward."""
    from engine.kv import KVPool
    from engine.model.attention import build_metadata

    mc = engine.model_config
    bs = engine.config.block_size
    blocks = [-(-len(s) // bs) for s in seqs]
    feats: list[torch.Tensor] = [None] * len(seqs)
    argmax: list[torch.Tensor] = [None] * len(seqs)
    i = 0
    while i < len(seqs):
        group = [i]
        while (group[-1] + 1 < len(seqs)
               and sum(len(seqs[j]) for j in group) + len(seqs[group[-1] + 1]) <= batch_tokens):
            group.append(group[-1] + 1)
        pool = KVPool(mc.num_layers, sum(blocks[j] for j in group), bs, mc.num_kv_heads,
                      mc.head_dim, engine.kv_dtype, engine.device)
        tables, slots, first = [], [], 0
        for j in group:
            table = list(range(first, first + blocks[j]))
            first += blocks[j]
            tables.append(table)
            slots.extend(table[p // bs] * bs + p % bs for p in range(len(seqs[j])))
        lens = [len(seqs[j]) for j in group]
        meta = build_metadata(lens, lens, tables, slots, bs, engine.device)
        ids = torch.tensor([t for j in group for t in seqs[j]], device=engine.device)
        pos = torch.tensor([p for n in lens for p in range(n)], device=engine.device)
        h = engine.model.forward(ids, pos, meta, pool.layers, engine.backend)  # [N, H]
        top = engine.model.logits(h).argmax(-1).cpu()  # [N]
        h = h.to(torch.bfloat16).cpu()
        off = 0
        for j, n in zip(group, lens):
            feats[j], argmax[j] = h[off:off + n], top[off:off + n]
            off += n
        progress(len(group))
        i = group[-1] + 1
    return feats, argmax


def choose_vocab(seqs: list[list[int]], size: int, vocab_size: int) -> torch.Tensor:
    """FR-Spec's reduced vocabulary: the `size` most frequent tokens of the sequences; ties and
    the remainder by token id (BPE ids follow merge order, roughly corpus frequency)."""
    counts = Counter(t for s in seqs for t in s)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    chosen = set(ranked)
    t = 0
    while len(ranked) < size and t < vocab_size:
        if t not in chosen:
            ranked.append(t)
        t += 1
    return torch.tensor(sorted(ranked), dtype=torch.long)


def batches(lengths: list[int], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Sequence indices grouped by similar length, about max_tokens (padded) per batch."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * max(lengths[j] for j in cur + [i]) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def ridge_fc(target, seqs: list[list[int]], feats: list[torch.Tensor], lam: float = 1.0,
             ) -> torch.Tensor:
    """The best LINEAR head, in closed form: the fc weight [H, 2H] of the ridge regression
    u_{j+1} ~ fc @ [f_j ; embed(token_{j+1})], where u is the target's next feature before its
    final norm's weight (f = u * w, so u has RMS 1 and the head's out_norm = w maps it back).

    Started from it (`train(init="ridge")`, with the layer's two output projections at zero, so
    at step 0 the head IS this linear map), the head begins where a linear predictor ends
    (held-out first-draft agreement ~0.31 on the shipped prompts, against ~0.24 for a bigram
    table and ~0.25 for the layer copied from the target after 100 steps) and its attention
    and MLP learn only what a linear map misses. Seconds: one 2H x 2H solve."""
    w_norm = target.loaded.weights["norm.weight"].float()
    embed = target.loaded.weights["embed_tokens.weight"].float()
    h2 = 2 * target.cfg.hidden_size
    xtx = torch.zeros(h2, h2, dtype=torch.float64)
    xty = torch.zeros(h2, h2 // 2, dtype=torch.float64)
    for s, f in zip(seqs, feats):
        f = f.float()
        x = torch.cat([f[:-1], embed[torch.tensor(s[1:])]], dim=1).double()
        y = (f[1:] / w_norm).double()
        xtx += x.T @ x
        xty += x.T @ y
    a = torch.linalg.solve(xtx + lam * torch.eye(h2, dtype=torch.float64), xty)  # [2H, H]
    return a.T.float().contiguous()


def low_precision():
    """bf16 autocast for the head's training where the CPU has bf16 units (AMX, AVX512-BF16);
    elsewhere fp32: without them bf16 matmuls are emulated, many times slower than fp32 for the
    head's small matrices, and the same training's numbers differ only in rounding."""
    import contextlib

    from engine.plan import machine_facts

    if machine_facts().bf16_units:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(target, seqs: list[list[int]], feats: list[torch.Tensor], labels: list[torch.Tensor],
          vocab: torch.Tensor, steps: int, seed: int = 0, lr: float = 3e-4,
          batch_tokens: int = 2048, noise: float = 0.05, reg_weight: float = 1.0,
          depth: int = 1, decay: float = 0.8, soft: bool = False, init: str = "ridge",
          progress=None) -> dict[str, torch.Tensor]:
    """Train a head on sequences, their target features [T, H] and the target's greedy next
    token at each position [T] (`features`); returns its fp32 weights (with "vocab").

    Row j of a sequence reads (f_j, token j + 1) and is trained to give f_{j+1} (smooth L1)
    and, through the reduced readout, the target's distribution after position j + 1: with
    `soft`, cross-entropy against the target's own softmax over the reduced vocabulary (its
    logits there are f_{j+1} @ readout^T, computed from the true feature), else against its
    greedy token (rows whose token is outside the reduced vocabulary only count for the
    feature). With depth > 1 the same rows are also unrolled depth - 1 further draft steps
    on the head's own predicted features (`eagle.unrolled_forward`, the training-time test),
    step r's loss weighted decay^r. init: "ridge" starts from the closed-form linear head
    (`ridge_fc`), "layer" from the target's last layer behind fc = [identity | small]."""
    from engine.spec.eagle import WEIGHT_NAMES, init_weights, rope_tables, unrolled_forward

    torch.manual_seed(seed)
    rng = random.Random(seed)
    cfg = target.cfg
    if init not in ("ridge", "layer"):
        raise ValueError(f"init must be 'ridge' or 'layer', got {init!r}")
    weights = init_weights(target, vocab, seed,
                           fc=ridge_fc(target, seqs, feats) if init == "ridge" else None)
    params = {n: weights[n].clone().requires_grad_(True) for n in WEIGHT_NAMES}
    embed = target.loaded.weights["embed_tokens.weight"].float()  # [V, H], frozen
    readout = target.loaded.weights.get("lm_head.weight", target.loaded.weights[
        "embed_tokens.weight"]).float()[vocab]  # [V', H], frozen
    to_sub = torch.full((cfg.vocab_size,), -100, dtype=torch.long)  # token id -> readout row
    to_sub[vocab] = torch.arange(len(vocab))
    longest = max(len(s) for s in seqs)
    cos, sin = rope_tables(cfg, longest + depth)
    opt = torch.optim.AdamW(params.values(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    lengths = [len(s) - 1 for s in seqs]
    plan: list[list[int]] = []
    warmup = max(1, steps // 20)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        if not plan:
            plan = batches(lengths, batch_tokens, rng)
        idx = plan.pop()
        t = max(lengths[i] for i in idx)
        hs = cfg.hidden_size
        f_in = torch.zeros(len(idx), t, hs)
        f_out = torch.zeros(depth, len(idx), t, hs)
        nxt = torch.zeros(depth, len(idx), t, dtype=torch.long)
        want = torch.full((depth, len(idx), t), -100, dtype=torch.long)
        mask = torch.zeros(depth, len(idx), t, dtype=torch.bool)
        for b, i in enumerate(idx):
            n = lengths[i]
            f = feats[i].float()
            f_in[b, :n] = f[:n]
            tok = torch.tensor(seqs[i])
            for r in range(min(depth, n)):
                m = n - r  # block r row j: token j + 1 + r, targets at j + 1 + r, j < n - r
                f_out[r, b, :m] = f[1 + r:n + 1]
                nxt[r, b, :m] = tok[1 + r:n + 1]
                want[r, b, :m] = to_sub[labels[i][1 + r:n + 1]]
                mask[r, b, :m] = True
        scale = lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = scale
        if noise:
            f_in = f_in + torch.randn(f_in.shape, generator=gen) * noise * f_in.std()
        with low_precision():
            preds = unrolled_forward(params, cfg, f_in, [embed[nxt[r]] for r in range(depth)],
                                     cos[:t + depth], sin[:t + depth])
        loss = torch.zeros(())
        ces, regs = [], []
        for r, pred_all in enumerate(preds):
            m = mask[r]
            pred = pred_all[m]
            with low_precision():
                logits = pred @ readout.T  # [N, V']
            true = f_out[r][m]
            if soft:
                with torch.no_grad():
                    p_target = torch.softmax(true @ readout.T, dim=-1)  # [N, V'] fp32
                ce = F.cross_entropy(logits.float(), p_target)
            else:
                ce = F.cross_entropy(logits.float(), want[r][m], ignore_index=-100)
            reg = F.smooth_l1_loss(pred.float(), true)
            loss = loss + decay ** r * (ce + reg_weight * reg)
            ces.append(ce.item())
            regs.append(reg.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        if progress is not None:
            progress(1, {"ce": "/".join(f"{c:.2f}" for c in ces), "reg": f"{regs[0]:.3f}"})
    out = {n: p.detach().clone() for n, p in params.items()}
    out["vocab"] = vocab
    return out


@torch.no_grad()
def agreement(target, weights: dict, seqs: list[list[int]], feats: list[torch.Tensor],
              prompt_lens: list[int], depth: int = 4) -> list[float]:
    """Held-out acceptance of greedy drafts, as `EagleProposer.propose` drafts them (the
    target's true features up to position j, then the head's own, `eagle.unrolled_forward`):
    for r = 1..depth, the fraction of the answers' positions where the head's first r drafted
    tokens all equal the target's next r tokens. Element 0 is the teacher-forced top-1
    agreement; element r / element r - 1 is the lesson's conditional a at draft position r + 1.
    """
    from engine.spec.eagle import WEIGHT_NAMES, rope_tables, unrolled_forward

    cfg = target.cfg
    embed = target.loaded.weights["embed_tokens.weight"].float()
    readout = target.loaded.weights.get("lm_head.weight", target.loaded.weights[
        "embed_tokens.weight"]).float()[weights["vocab"]]
    w = {n: weights[n].float() for n in WEIGHT_NAMES}
    hit = [0] * depth
    total = 0
    for s, f, p in zip(seqs, feats, prompt_lens):
        n = len(s) - 1  # rows j = 0 .. n - 1: (f_j, token j + 1)
        cos, sin = rope_tables(cfg, n + depth)
        toks = torch.tensor(s + [0] * depth)
        preds = unrolled_forward(w, cfg, f[:n].float()[None],
                                 [embed[toks[1 + r:1 + r + n]][None] for r in range(depth)],
                                 cos, sin)
        # row j drafts tokens j + 2 .. j + 1 + depth; count rows whose first draft is an answer
        # token and whose whole chain lies inside the sequence
        rows = torch.arange(n)
        ok = (rows + 2 >= p) & (rows + 1 + depth <= n)
        chain = ok.clone()
        for r, pred in enumerate(preds):
            tok = weights["vocab"][(pred[0] @ readout.T).argmax(-1)]  # [n]
            want = toks[(rows + 2 + r).clamp(max=n)]
            chain &= tok == want
            hit[r] += int(chain.sum())
        total += int(ok.sum())
    return [h / max(total, 1) for h in hit]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.spec.train_draft",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps ({STEPS})")
    ap.add_argument("--vocab", type=int, default=None, help="reduced vocabulary size (8192)")
    ap.add_argument("--prompts", type=int, default=0, help="use only the first N prompts")
    ap.add_argument("--max-tokens", type=int, default=128,
                    help="cap each answer (128; 0: the file's max_tokens)")
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--init", choices=("ridge", "layer"), default="ridge",
                    help="start from the closed-form linear head (ridge, the default) or from "
                         "the target's last layer (layer: the first two rounds' head)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, default=DEPTH,
                    help=f"draft steps trained per position ({DEPTH}): 1 = the target's true "
                         "features only; more also trains steps 2.. on the head's own "
                         "predicted features (the training-time test; cost grows with it)")
    ap.add_argument("--soft", action=argparse.BooleanOptionalAction, default=SOFT,
                    help="cross-entropy on the target's softmax over the reduced vocabulary "
                         f"(default {'on' if SOFT else 'off'}); --no-soft: on its greedy token")
    ap.add_argument("--samples", type=int, default=SAMPLES,
                    help=f"sampled answers per prompt besides the greedy one ({SAMPLES}; "
                         f"temperature {TEMPERATURE}): more text for the head to read, always "
                         "labelled with the target's greedy next token")
    ap.add_argument("--out", help="where to write the head (default: the ServeLab cache)")
    ap.add_argument("--quick", action="store_true", help="a small head in a minute or two")
    ap.add_argument("--regenerate", action="store_true",
                    help="recompute the target's answers and features even if kept")
    args = ap.parse_args(argv)
    from tqdm.auto import tqdm

    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.spec.eagle import VOCAB_SIZE, head_path, save_weights

    if args.quick:
        args.steps = min(args.steps, 60)
        args.prompts = args.prompts or 48
        args.max_tokens = min(args.max_tokens or 64, 64)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    vocab_size = args.vocab or VOCAB_SIZE
    torch.manual_seed(args.seed)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    items = load_prompts()
    if args.prompts:
        items = items[:args.prompts]
    if args.max_tokens:
        items = [dict(it, max_tokens=min(it["max_tokens"], args.max_tokens)) for it in items]
    # every prompt at once: a decode step over 200 requests costs little more than over 30
    seats = min(len(items), 256)
    engine = LLMEngine(EngineConfig(model=args.model, max_num_seqs=seats, max_model_len=512,
                                    max_num_batched_tokens=max(2048, seats), seed=args.seed))
    # the target's answers and features depend only on the prompts: kept beside the head, so
    # a second training run (another seed, more steps) skips steps 1 and 2
    data_key = json.dumps([DATA_FORMAT, args.model, engine.describe(), items]
                          + ([args.samples, TEMPERATURE, args.seed] if args.samples else []),
                          sort_keys=True)
    data_file = head_path(args.model).parent / (
        "train-data-" + hashlib.sha256(data_key.encode()).hexdigest()[:16] + ".pt")
    if data_file.is_file() and not args.regenerate:
        seqs, prompt_lens, feats, labels = torch.load(data_file)
        print(f"reusing the target's answers and features from {data_file}")
    else:
        with tqdm(total=len(items) * (1 + args.samples),
                  desc="1/2 the target's answers and features", unit="answer") as bar:
            seqs, feats, labels = generate(engine, items, bar.update)
            prompt_lens = [len(engine.requests[f"r{i}"].prompt_token_ids)
                           for i in range(len(items))]
            for r in range(args.samples):  # sequence i + (r + 1) * len(items): item i again
                more = generate(engine, items, bar.update, TEMPERATURE, args.seed + r + 1)
                seqs, feats, labels = seqs + more[0], feats + more[1], labels + more[2]
                prompt_lens += prompt_lens[:len(items)]
        data_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save((seqs, prompt_lens, feats, labels), data_file)
    vocab = choose_vocab(seqs, vocab_size, engine.model_config.vocab_size)
    # hold out every 10th sequence to report agreement on answers the head never saw
    # (greedy answers only; a held-out prompt's sampled answers are not trained on either)
    held = [i for i in range(len(items)) if i % 10 == 9]
    fit = [i for i in range(len(seqs)) if i % len(items) % 10 != 9]
    with tqdm(total=args.steps, desc="2/2 training the head", unit="step") as bar:
        def tick(n, post):
            bar.update(n)
            bar.set_postfix(post)
        weights = train(engine.model, [seqs[i] for i in fit], [feats[i] for i in fit],
                        [labels[i] for i in fit], vocab, args.steps, args.seed, args.lr,
                        args.batch_tokens, depth=args.depth, soft=args.soft,
                        init=args.init, progress=tick)
    chain = agreement(engine.model, weights, [seqs[i] for i in held], [feats[i] for i in held],
                      [prompt_lens[i] for i in held])
    answer_tokens = [t for s, p in zip(seqs[:len(items)], prompt_lens) for t in s[p:]]
    coverage = sum(t in set(vocab.tolist()) for t in answer_tokens) / max(len(answer_tokens), 1)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    meta = {"model": args.model, "seed": args.seed, "steps": args.steps, "vocab": vocab_size,
            "depth": args.depth, "soft": args.soft, "samples": args.samples,
            "init": args.init, "lr": args.lr,
            "prompts": len(items), "train_tokens": sum(len(seqs[i]) for i in fit),
            "held_out_agreement": round(chain[0], 4),
            "held_out_chain": " ".join(f"{c:.4f}" for c in chain), "vocab_coverage": round(coverage, 4),
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    out = Path(args.out) if args.out else head_path(args.model)
    save_weights(weights, out, meta)
    alpha = [chain[0]] + [c / p if p else 0.0 for p, c in zip(chain, chain[1:])]
    print(f"wrote {out}: held-out teacher-forced agreement {chain[0]:.3f}; drafts of 1..4 all "
          f"right {' '.join(f'{c:.3f}' for c in chain)} (a by position "
          f"{' '.join(f'{a:.2f}' for a in alpha)}); reduced vocabulary "
          f"covers {coverage:.1%} of answer tokens; {wall:.0f} s wall, {cpu:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
