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


def test_an_answer_cut_inside_a_character_does_not_end_in_a_replacement(tokenizer):
    """max_tokens can end an answer between the tokens of one Chinese character or emoji:
    the finished text stops before it, with no U+FFFD, and holds every whole character."""
    ids = tokenizer.encode("你好，世界！🙂🚀")
    cuts = [n for n in range(1, len(ids) + 1)
            if tokenizer.decode(ids[:n], skip_special_tokens=False).endswith("\ufffd")]
    assert cuts, "the text has no character split over tokens"
    for n in cuts:
        d = Detokenizer(tokenizer)
        streamed = ""
        for t in ids[:n]:
            d.add(t)
            streamed += d.take(False)
        d.finish()
        streamed += d.take(True)
        whole = tokenizer.decode(ids[:n], skip_special_tokens=False)
        assert "\ufffd" not in d.text and "\ufffd" not in streamed
        assert d.text == whole.rstrip("\ufffd") == streamed
