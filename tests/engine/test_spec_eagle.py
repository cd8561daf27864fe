"""The EAGLE draft head (engine/spec/eagle.py) and its training (engine/spec/train_draft.py).

Losslessness with the head is in tests/engine/test_spec_engine.py (greedy identity,
chi-square), with a head trained for a few seconds here (`tiny_head`): losslessness does not depend on how good
the draft is, so no test waits for the 15-minute training.
"""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.workloads import GROUNDED, OPEN, chat
from engine.config import EngineConfig
from engine.spec import eagle
from engine.spec.train_draft import DATA, DATA_MORE, batches, choose_vocab, load_prompts

# ---------------------------------------------------------------------------------------------
# Fast: no model


def test_training_prompts_are_disjoint_from_the_benchmark_prompts():
    """The head is evaluated (python -m benchmarks.bench --spec) on the `grounded` and `open`
    workloads: none of their prompts, nor their task text, is in the training set."""
    train = [it["prompt"] for it in load_prompts()]
    assert len(train) >= 150 and len(set(train)) == len(train), "too few or repeated prompts"
    kinds = {it["kind"] for it in load_prompts()}
    assert kinds == {"open", "grounded", "chat"}
    evaluated = [p for p, _ in GROUNDED] + [p for p, _ in OPEN]
    for e in evaluated:
        for t in train:
            assert e != t and e not in t and t not in e, f"shared prompt: {e[:60]!r}"
            assert chat(e) != chat(t)
    # the training answers are asked in the bench's chat markup
    from engine.spec.train_draft import chat as train_chat

    assert all(train_chat(t) == chat(t) for t in train[:5])
    # the data file is plain JSONL, one object per line
    for line in (DATA.read_text(encoding="utf-8") + DATA_MORE.read_text(encoding="utf-8")
                 ).splitlines():
        assert set(json.loads(line)) == {"kind", "prompt", "max_tokens"}
    # the generated file is what its generator writes (seeded)
    from engine.spec.data.make_prompts import make

    assert [json.loads(x) for x in DATA_MORE.read_text(encoding="utf-8").splitlines()] == make()


def test_reduced_vocabulary_is_the_most_frequent_tokens():
    seqs = [[5, 5, 5, 9, 9, 2], [9, 7, 5]]
    v = choose_vocab(seqs, 3, vocab_size=20)
    assert v.tolist() == [2, 5, 9], "5 (4x) and 9 (3x), then the tie 2 / 7 by id"
    v = choose_vocab(seqs, 8, vocab_size=20)  # more than seen: padded by the lowest ids
    assert v.tolist() == sorted(set(v.tolist())) and len(v) == 8
    assert set(v.tolist()) >= {2, 5, 7, 9} and set(v.tolist()) >= {0, 1, 3}


def test_batches_cover_every_sequence_once():
    import random

    lengths = [5, 50, 7, 300, 12, 12, 90]
    got = batches(lengths, 128, random.Random(0))
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))
    for b in got:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 128


# ---------------------------------------------------------------------------------------------
# The real target (fp32): the engine's head forward is the training forward


@pytest.fixture(scope="module")
def target():
    from engine.model.llama import shared_model
    from engine.model.loader import load_model
    from engine.plan import plan_for

    loaded = load_model("smollm2-135m", torch.float32)
    plan = plan_for(EngineConfig(device="cpu", dtype="float32", weights="dense",
                                 cpu_kernels=False))
    return shared_model(loaded, plan, 256)


def test_missing_head_names_the_command(target):
    with pytest.raises(ValueError, match="python -m engine.spec.train_draft"):
        eagle.load_head(target, None, "no-such-model")
    with pytest.raises(ValueError, match="no such EAGLE head file"):
        eagle.load_head(target, "/nonexistent/head.safetensors", "smollm2-135m")


def test_a_wrong_file_is_refused(target, tmp_path):
    w = eagle.init_weights(target, torch.arange(64))
    del w["fc"]
    path = tmp_path / "bad.safetensors"
    eagle.save_weights(w, path)
    with pytest.raises(ValueError, match="missing"):
        eagle.load_head(target, path, "smollm2-135m")


def test_engine_head_forward_equals_the_training_forward(target):
    """EagleHead.forward through the paged KV cache (a prefix in one chunk, then one token at
    a time, as propose runs it) gives the features train_forward computes for the whole
    sequence at once: training and drafting see the same function."""
    from engine.kv import KVPool, PagedAllocator
    from engine.model.attention import build_metadata, get_backend

    torch.manual_seed(0)
    w = eagle.init_weights(target, torch.arange(512), seed=3)
    w["fc"][:, 576:] = torch.randn(576, 576) * 0.05  # make the token half matter
    head = eagle.EagleHead(target, w)
    cfg, n, bs = target.cfg, 21, 4
    feats = torch.randn(n, cfg.hidden_size)
    toks = torch.randint(0, 5000, (n,))
    cos, sin = eagle.rope_tables(cfg, n)
    ref = eagle.train_forward({k: w[k] for k in eagle.WEIGHT_NAMES}, cfg, feats[None],
                              target.embed[toks][None], cos, sin)[0]  # [n, H]
    pool = KVPool(1, 8, bs, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
    alloc = PagedAllocator(8, bs)
    seq = eagle.HeadSeq("t")
    assert alloc.ensure_slots(seq, n)
    backend = get_backend("torch")

    def run(start: int, stop: int) -> torch.Tensor:
        slots = [seq.block_table[p // bs] * bs + p % bs for p in range(start, stop)]
        meta = build_metadata([stop - start], [stop], [seq.block_table], slots, bs, "cpu")
        return head.forward(feats[start:stop], toks[start:stop], torch.arange(start, stop),
                            meta, pool.layers[0], backend)

    got = [run(0, 15)] + [run(p, p + 1) for p in range(15, n)]
    got = torch.cat(got)
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4), (got - ref).abs().max()
    logits = head.logits(got[-1:])  # [1, 512]: the reduced readout is the lm_head's rows
    assert torch.allclose(logits, got[-1:] @ target.plain_lm_head[:512].T, atol=1e-4)


def test_unrolled_forward_is_the_drafting_chain(target):
    """Block r of the training-time test equals the head run as propose runs it: the
    target's features through position j into the paged KV, then r steps each reading the
    head's own previous prediction. Block 0 is train_forward."""
    from engine.kv import KVPool, PagedAllocator
    from engine.model.attention import build_metadata, get_backend

    torch.manual_seed(1)
    w = eagle.init_weights(target, torch.arange(512), seed=5)
    w["fc"][:, 576:] = torch.randn(576, 576) * 0.05
    W = {k: w[k] for k in eagle.WEIGHT_NAMES}
    head = eagle.EagleHead(target, w)
    cfg, n, depth, bs = target.cfg, 9, 3, 4
    feats = torch.randn(n, cfg.hidden_size)
    toks = torch.randint(0, 5000, (n + depth,))
    cos, sin = eagle.rope_tables(cfg, n + depth)
    blocks = eagle.unrolled_forward(W, cfg, feats[None],
                                    [target.embed[toks[1 + r:1 + r + n]][None]
                                     for r in range(depth)], cos, sin)
    ref = eagle.train_forward(W, cfg, feats[None], target.embed[toks[1:n + 1]][None],
                              cos[:n], sin[:n])
    assert torch.allclose(blocks[0], ref, atol=1e-5)
    backend = get_backend("torch")
    for j in (0, 4, n - 1):
        pool = KVPool(1, 8, bs, cfg.num_kv_heads, cfg.head_dim, torch.float32,
                      torch.device("cpu"))
        alloc = PagedAllocator(8, bs)
        seq = eagle.HeadSeq("t")
        assert alloc.ensure_slots(seq, j + depth)

        def run(start, f, ids, seq=seq, pool=pool):
            stop = start + len(ids)
            slots = [seq.block_table[p // bs] * bs + p % bs for p in range(start, stop)]
            meta = build_metadata([stop - start], [stop], [seq.block_table], slots, bs, "cpu")
            return head.forward(f, torch.tensor(ids), torch.arange(start, stop), meta,
                                pool.layers[0], backend)[-1:]

        h = run(0, feats[:j + 1], toks[1:j + 2].tolist())  # true features 0..j
        for r in range(depth):
            assert torch.allclose(h[0], blocks[r][0, j], atol=2e-4), (j, r)
            if r + 1 < depth:  # the next step reads its own prediction at position j + r + 1
                h = run(j + r + 1, h, [int(toks[j + r + 2])])


def effective_weights(model, w: dict) -> dict:
    """The head's weights as the engine multiplies them: on a GGUF target the linear ones
    are Q8_0 (EagleHead quantizes them), so the reference forward reads their dequantization."""
    import gguf
    import numpy as np

    from engine.model.gguf import quantize_q8_0

    out = {n: w[n] for n in eagle.WEIGHT_NAMES}
    if model.layout in ("gguf", "gguf-q8", "gguf-q16"):
        for n in eagle.LINEAR_NAMES:
            rows = quantize_q8_0(w[n]).numpy()
            deq = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType.Q8_0)
            out[n] = torch.from_numpy(np.ascontiguousarray(deq, dtype=np.float32))
    return out


@pytest.mark.parametrize("weights", ["gguf", "gguf-q8", "gguf-q16"])
def test_head_on_a_gguf_target_reads_q8_0_rows(weights):
    """On a GGUF target (the default on CPUs without AMX) the head's linear weights are Q8_0
    rows and its readout is the target's own Q8_0 output-head rows of the reduced vocabulary:
    about a quarter of the bytes of an fp32 head, with a forward equal to the fp32 training
    forward on the dequantized weights, within accumulation-order error. With int8 activations
    in the target (gguf-q8) the head runs the int8 kernel too: the same rows regrouped by 16
    columns (pack_q8), its forward within int8 rounding of the fp32 one; with int16 ones
    (gguf-q16) the int16 kernel (pack_q16), within int16 rounding."""
    from engine.kv import KVPool, PagedAllocator
    from engine.model.attention import build_metadata, get_backend
    from engine.model.cpu import library
    from engine.model.llama import shared_model
    from engine.model.loader import load_model

    if not library.load():
        pytest.skip("the C++ CPU kernels did not build here")
    from engine.plan import plan_for

    plan = plan_for(EngineConfig(device="cpu", dtype="float32", weights=weights))
    gguf_target = shared_model(load_model("smollm2-135m", torch.float32), plan, 256)
    torch.manual_seed(0)
    w = eagle.init_weights(gguf_target, torch.arange(0, 4096, 2), seed=3)
    w["fc"][:, 576:] = torch.randn(576, 576) * 0.05
    head = eagle.EagleHead(gguf_target, w)
    from engine.model.gguf import quantize_q8_0, read_linear_weights
    from engine.model.layouts import LAYOUTS

    assert head.row is LAYOUTS[weights] is gguf_target.row and head.isa == plan.isa
    pack = LAYOUTS[weights].pack  # the row's: pack_q8 / pack_q16 for the integer kernels
    grouped = pack is not None
    regroup = pack if grouped else (lambda t, k: t)
    for n in eagle.LINEAR_NAMES:
        k = w[n].shape[1]
        assert torch.equal(head.w[n], regroup(quantize_q8_0(w[n]), k))
    rows = read_linear_weights(gguf_target.loaded)["lm_head"]
    assert torch.equal(head.readout, regroup(rows[w["vocab"]].contiguous(), 576))
    dense = sum(w[n].numel() * 4 for n in eagle.WEIGHT_NAMES) + 2048 * 576 * 4
    assert head.weight_bytes < 0.3 * dense
    cfg, n, bs = gguf_target.cfg, 9, 4
    feats = torch.randn(n, cfg.hidden_size)
    toks = torch.randint(0, 5000, (n,))
    cos, sin = eagle.rope_tables(cfg, n)
    ref = eagle.train_forward(effective_weights(gguf_target, w), cfg, feats[None],
                              gguf_target.embed[toks][None], cos, sin)[0]
    pool = KVPool(1, 4, bs, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
    seq = eagle.HeadSeq("t")
    assert PagedAllocator(4, bs).ensure_slots(seq, n)
    slots = [seq.block_table[p // bs] * bs + p % bs for p in range(n)]
    meta = build_metadata([n], [n], [seq.block_table], slots, bs, "cpu")
    got = head.forward(feats, toks, torch.arange(n), meta, pool.layers[0], get_backend("torch"))
    logits = head.logits(got)
    want = got @ gguf_target.plain_lm_head[w["vocab"]].T
    if not grouped:
        assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4), (got - ref).abs().max()
        assert torch.allclose(logits, want, atol=2e-4)
        return
    rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    if weights == "gguf-q16":  # 2^-16 of each block's largest input: 256x finer than int8
        assert 1e-8 < rel < 1e-3, rel
        assert ((logits - want).norm(dim=-1) / want.norm(dim=-1)).max().item() < 1e-3
        return
    # int8 activations: each block of 32 inputs rounded to 8 bits, a relative error of a few
    # tenths of a percent per product, 2.5% over the layer here; an fp32 forward would be exact
    # and a wrong row order far off
    assert 1e-6 < rel < 0.06, rel  # 0.025 measured
    assert ((logits - want).norm(dim=-1) / want.norm(dim=-1)).max().item() < 0.06


def test_ridge_start_is_the_least_squares_linear_head(target):
    """train(init="ridge") starts from fc = the ridge solution of u_{j+1} ~ fc [f_j ; e_{j+1}]
    (u: the next feature before the final norm's weight), and with the layer's output
    projections at zero the head at step 0 is exactly that linear map, normed."""
    from engine.spec.train_draft import ridge_fc

    gen = torch.Generator().manual_seed(4)
    w_norm = target.loaded.weights["norm.weight"].float()
    seqs = [torch.randint(0, 3000, (n,), generator=gen).tolist() for n in (700, 900)]
    feats = [(torch.nn.functional.rms_norm(torch.randn(len(s), 576, generator=gen), (576,))
              * w_norm).to(torch.bfloat16) for s in seqs]
    fc = ridge_fc(target, seqs, feats, lam=1.0)
    x = torch.cat([torch.cat([f.float()[:-1], target.embed[torch.tensor(s[1:])]], 1)
                   for s, f in zip(seqs, feats)]).double()
    y = torch.cat([f.float()[1:] / w_norm for f in feats]).double()
    grad = x.T @ (x @ fc.double().T - y) + fc.double().T  # the ridge objective's gradient / 2
    assert grad.abs().max() < 1e-3 * (x.T @ y).abs().max()
    w = eagle.init_weights(target, torch.arange(512), seed=0, fc=fc)
    assert not w["o"].any() and not w["down"].any()
    s, f = seqs[0][:40], feats[0][:40].float()
    cos, sin = eagle.rope_tables(target.cfg, 39)
    e = target.embed[torch.tensor(s[1:])]
    out = eagle.train_forward({k: w[k] for k in eagle.WEIGHT_NAMES}, target.cfg, f[None, :-1],
                              e[None], cos, sin)[0]
    lin = torch.nn.functional.rms_norm(torch.cat([f[:-1], e], 1) @ fc.T, (576,),
                                       eps=target.cfg.rms_norm_eps) * w_norm
    assert torch.allclose(out, lin, atol=1e-5)


@pytest.mark.slow
def test_recorded_features_equal_a_whole_sequence_forward():
    """train_draft.generate records the target's features and greedy next tokens from the
    forwards that decode the answers (prefill chunks, then one token per step, in a batch of
    three); they are the same bits a single forward over each whole sequence gives."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.spec.train_draft import features, generate

    eng = LLMEngine(EngineConfig(max_num_seqs=3, max_model_len=256))
    items = [{"prompt": "Name three colours.", "max_tokens": 12},
             {"prompt": 'Convert this JSON to YAML: {"a": 1, "b": [2, 3]}', "max_tokens": 20},
             {"prompt": "Write a poem about rain.", "max_tokens": 16}]
    seqs, feats, labels = generate(eng, items, lambda n: None, temperature=0.8, seed=3)
    assert eng.feature_observer is None and not eng.runner.keep_hidden
    want_feats, want_labels = features(eng, seqs, lambda n: None)
    for s, f, lab, wf, wl in zip(seqs, feats, labels, want_feats, want_labels):
        assert f.shape == (len(s), 576) and lab.shape == (len(s),)
        assert torch.equal(f, wf) and torch.equal(lab, wl)


@pytest.mark.slow
def test_engine_drafts_are_the_training_forwards_argmax(target, tmp_path):
    """Every chain the engine drafts (EagleProposer.propose over the target's features as the
    verification forwards hand them over) is the argmax chain of the training-time forward
    (`unrolled_forward`) on the target's features of the same tokens: same feature (final
    normed, the right position), same token offset, the head's own feature for steps 2..k.
    An off-by-one anywhere between training and drafting would make them disagree."""
    from engine.config import EngineConfig, SamplingParams, SpecConfig
    from engine.engine import LLMEngine
    from engine.spec.train_draft import features

    w = eagle.init_weights(target, torch.arange(2048), seed=2)
    w["fc"][:, 576:] = torch.randn(576, 576, generator=torch.Generator().manual_seed(2)) * 0.05
    path = tmp_path / "eagle-test.safetensors"
    eagle.save_weights(w, path)
    k = 3
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=2,
                                 spec=SpecConfig("eagle", k, draft_model=str(path),
                                                 min_confidence=0.0)))  # a random head doubts
    prop = eng.spec_decoder.draft
    log, propose = [], prop.propose

    def spy(reqs, ks):
        out = propose(reqs, ks)
        log.extend((r.request_id, list(r.all_token_ids), list(p.token_ids))
                   for r, p in zip(reqs, out))
        return out

    prop.propose = spy
    rids = [eng.add_request(chat(p), SamplingParams(max_tokens=12, ignore_eos=True))
            for p in ("Name three colours.", "Write the word cat twice.")]
    while eng.has_unfinished():
        eng.step()
    W = effective_weights(eng.model, w)  # on a GGUF target the head runs in Q8_0
    readout = target.plain_lm_head[w["vocab"]]
    same = total = 0
    for rid in rids:
        o = eng.output(rid)
        full = list(o.prompt_token_ids) + list(o.token_ids)
        (f,), _ = features(eng, [full], lambda n: None)
        for r_id, ctx, drafted in log:
            if r_id != rid or not drafted:
                continue
            m = len(ctx)  # features of positions 0..m - 2 are known; row m - 2 drafts
            assert full[:m] == ctx
            toks = torch.tensor(ctx + drafted + [0] * k)
            cos, sin = eagle.rope_tables(target.cfg, m + k)
            blocks = eagle.unrolled_forward(
                W, target.cfg, f[:m - 1].float()[None],
                [target.embed[toks[1 + r:m + r]][None] for r in range(len(drafted))], cos, sin)
            want = [int(w["vocab"][(b[0, -1] @ readout.T).argmax()]) for b in blocks]
            same += sum(a == b for a, b in zip(want, drafted))
            total += len(drafted)
    assert total >= 10 and same >= 0.95 * total, (same, total)


def test_training_is_seeded_and_lowers_the_loss(target):
    """Two runs with one seed give the same weights; a few steps already fit a tiny set."""
    from engine.spec.train_draft import train

    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (24, 17, 30)]
    feats = [torch.randn(len(s), 576, generator=gen).to(torch.bfloat16) for s in seqs]
    labels = [torch.tensor(s[1:] + [0]) for s in seqs]  # "the next token" as the target's
    vocab = choose_vocab(seqs, 256, 49152)
    losses: list[float] = []
    a = train(target, seqs, feats, labels, vocab, steps=4, seed=7, batch_tokens=128, depth=2,
              progress=lambda n, post: losses.append(float(post["ce"].split("/")[0])))
    b = train(target, seqs, feats, labels, vocab, steps=4, seed=7, batch_tokens=128, depth=2)
    for name in eagle.WEIGHT_NAMES:
        assert torch.equal(a[name], b[name]), f"{name} differs between two seeded runs"
    assert torch.equal(a["vocab"], vocab)
    assert len(losses) == 4 and all(x > 0 for x in losses)


@pytest.mark.parametrize("weights", ["gguf", "gguf-q8", "gguf-q16"])
def test_head_in_the_cpp_layer_loop_gives_the_python_loops_bits(weights):
    """Where the target runs its layers in C++ (decode_layers), the head's one layer runs
    there too: the same kernels in the same order, so the same bits as the head's Python
    forward, and the same K/V written, for a batch of sequences bringing 1, 3 and 5 tokens."""
    from engine.kv import KVPool, PagedAllocator
    from engine.model.attention import build_metadata, get_backend
    from engine.model.cpu import library
    from engine.model.llama import shared_model
    from engine.model.loader import load_model

    if not library.load():
        pytest.skip("the C++ CPU kernels did not build here")
    from engine.plan import plan_for

    target = shared_model(load_model("smollm2-135m", torch.float32),
                          plan_for(EngineConfig(device="cpu", dtype="float32", weights=weights)),
                          256)
    w = eagle.init_weights(target, torch.arange(0, 4096, 2), seed=5)
    w["fc"][:, 576:] = torch.randn(576, 576, generator=torch.Generator().manual_seed(1)) * 0.05
    head = eagle.EagleHead(target, w)
    assert head.cpp_loop
    cfg, bs, backend = target.cfg, 4, get_backend("cpu")
    g = torch.Generator().manual_seed(2)
    lens, tables, slots, pos = [1, 3, 5], [], [], []
    alloc = PagedAllocator(12, bs)
    for i, n in enumerate(lens):
        seq = eagle.HeadSeq(f"s{i}")
        assert alloc.ensure_slots(seq, 8 + n)
        tables.append(seq.block_table)
        slots += [seq.block_table[p // bs] * bs + p % bs for p in range(8, 8 + n)]
        pos += list(range(8, 8 + n))
    n = sum(lens)
    feats = torch.randn(n, cfg.hidden_size, generator=g)
    toks = torch.randint(0, 5000, (n,), generator=g)
    outs, pools = [], []
    for cpp in (True, False):
        pool = KVPool(1, 12, bs, cfg.num_kv_heads, cfg.head_dim, torch.float32,
                      torch.device("cpu"))
        for t in pool.layers[0]:  # a context of 8 earlier positions, the same for both
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(3)))
        meta = build_metadata(lens, [8 + m for m in lens], tables, slots, bs, "cpu")
        assert target.runs_cpp_layer_loop(meta, backend)
        head.cpp_loop = cpp
        outs.append(head.forward(feats, toks, torch.tensor(pos), meta, pool.layers[0], backend))
        pools.append([t.clone() for t in pool.layers[0]])
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*pools))
