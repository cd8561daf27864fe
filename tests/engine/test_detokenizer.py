"""The incremental detokenizer's decode (engine/detokenizer.py): calling a fast tokenizer's Rust
backend directly must give exactly what `tokenizer.decode` gives, window by window and over a
whole output, and a tokenizer that cleans up spaces must keep its own decode."""

from __future__ import annotations

import random

from engine.detokenizer import Detokenizer, fast_decode

TEXT = ("The week has seven days: Monday, Tuesday ... and Sunday. 你好，世界！ Grüße 🙂🚀 "
        "def f(x):\n    return x ** 2  # squares\n\n<|im_end|>")


class SlowPath:
    """The bundled tokenizer seen only through its decode(): no backend to call directly."""

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode


def test_fast_decode_equals_the_tokenizers_decode(tokenizer):
    ids = tokenizer.encode(TEXT)
    decode = fast_decode(tokenizer)
    assert decode.__closure__ is not None and "backend" in decode.__code__.co_freevars
    rng = random.Random(0)
    windows = [ids[i:j] for i in range(len(ids)) for j in (i + 1, i + 2, i + 3)]
    windows += [rng.sample(range(tokenizer.vocab_size), 5) for _ in range(200)]
    for w in windows:
        assert decode(w) == tokenizer.decode(w, skip_special_tokens=False), w


def test_detokenizer_text_is_the_same_on_either_path(tokenizer):
    ids = tokenizer.encode(TEXT)
    fast, slow = Detokenizer(tokenizer, stop=["Sunday"]), Detokenizer(SlowPath(tokenizer),
                                                                      stop=["Sunday"])
    for t in ids:
        assert fast.add(t) == slow.add(t)
        assert fast.take(False) == slow.take(False)
        assert fast.text == slow.text
    fast.finish()
    slow.finish()
    assert fast.text == slow.text and fast.visible(True) == slow.visible(True)


def test_a_tokenizer_that_cleans_up_spaces_keeps_its_own_decode():
    class Backend:
        def decode(self, ids, skip_special_tokens):
            return "raw"

    class CleaningTokenizer:
        clean_up_tokenization_spaces = True
        _tokenizer = Backend()

        def decode(self, ids, skip_special_tokens):
            return "cleaned"

    assert fast_decode(CleaningTokenizer())([1]) == "cleaned"
    CleaningTokenizer.clean_up_tokenization_spaces = False
    assert fast_decode(CleaningTokenizer())([1]) == "raw"


def test_an_output_cut_inside_a_character_ends_at_the_last_whole_one(tokenizer):
    """max_tokens can fall between the byte tokens of one Chinese character or emoji: the
    finished text holds every complete character and no U+FFFD."""
    cuts = 0
    for text in ("你好，世界", "🙂🚀", "Grüße 饕餮"):
        ids = tokenizer.encode(text)
        for n in range(1, len(ids) + 1):
            d = Detokenizer(tokenizer)
            streamed = ""
            for t in ids[:n]:
                d.add(t)
                streamed += d.take(False)
            d.finish()
            whole = tokenizer.decode(ids[:n], skip_special_tokens=False)
            assert "\ufffd" not in d.text, (text, n, d.text)
            # what is held back is the unfinished character (with a space that shares its token)
            held = whole[len(d.text):]
            assert whole.startswith(d.text) and (not held or "\ufffd" in held), (text, n)
            assert (streamed + d.take(True)) == d.text, "nothing streamed is taken back"
            cuts += whole.endswith("\ufffd")
    assert cuts > 0, "some cut fell inside a character (else this test shows nothing)"


def _byte_tokens() -> dict[int, str]:
    """GPT-2's byte-level alphabet (the bundled tokenizer's): each byte's one-character token."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    others = [b for b in range(256) if b not in bs]  # mapped past U+00FF, in order
    return dict(zip(bs + others, map(chr, cs + [256 + i for i in range(len(others))])))


def test_a_models_own_invalid_bytes_show_as_the_full_decode_shows_them(tokenizer):
    """Broken characters in an answer ("概\ufffda") are the model's own bytes, not a
    character the stream split: a byte-level model can sample a UTF-8 lead byte and then a
    token that is no continuation of it. The stream then shows exactly what decoding the whole
    output shows (U+FFFD where the bytes are invalid, as Hugging Face and vLLM decode them),
    nothing more and nothing lost; a character split over byte tokens never shows one.
    (benchmarks/invalid_utf8.py counts how often the bundled model does this.)"""
    byte_token = {b: tokenizer.convert_tokens_to_ids(c) for b, c in _byte_tokens().items()}
    # a byte-level vocabulary: a token for each byte used here (bytes UTF-8 never uses have none)
    assert all(byte_token[b] != tokenizer.unk_token_id for b in "概a".encode())
    lead = "概".encode()[0]  # 0xE6: a three-byte character's first byte
    for tail in ("a", "你好"):
        ids = tokenizer.encode("概") + [byte_token[lead]] + tokenizer.encode(tail)
        d = Detokenizer(tokenizer)
        streamed = ""
        for t in ids:
            d.add(t)
            streamed += d.take(False)
        d.finish()
        streamed += d.take(True)
        whole = tokenizer.decode(ids, skip_special_tokens=False)
        assert whole == f"概\ufffd{tail}" and streamed == whole, (tail, streamed, whole)
    # the same character as separate byte tokens: whole, never a U+FFFD on the way
    d = Detokenizer(tokenizer)
    for b in "概a".encode():
        d.add(byte_token[b])
        assert "\ufffd" not in d.take(False)
    d.finish()
    assert d.text == "概a"


def test_hold_back_matches_every_prefix_check_and_is_linear_in_the_text():
    """The KMP matcher's held tail equals the plain rule (the longest prefix of a stop string
    the text ends with, shorter than the stop string), and a long stop string costs each
    token only its own characters."""
    import random
    import time

    from engine.detokenizer import advance, prefix_function

    rng = random.Random(1)
    for _ in range(2000):
        s = "".join(rng.choice("ab") for _ in range(rng.randint(1, 7)))
        pi, q, text = prefix_function(s), 0, ""
        for _ in range(rng.randint(0, 12)):
            ch = rng.choice("ab")
            q, text = advance(s, pi, q, ch), text + ch
            assert q == max((k for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    stop = "a" * 200_000 + "b"  # every token's text could start it
    pi = prefix_function(stop)
    t0, q = time.perf_counter(), 0
    for _ in range(2000):
        q = advance(stop, pi, q, "aa")
    assert q == 4000
    # the quadratic rule took seconds per token here; this is microseconds per token
    assert time.perf_counter() - t0 < 1.0
