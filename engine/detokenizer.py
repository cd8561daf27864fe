"""Token ids -> text, a few tokens at a time, and the stop-string rule.

Decoding a request's whole output again after every token costs time in proportion to its
length, for every request, every step. Instead each request keeps a `Detokenizer` that
decodes only a short window: the tokens since the last complete piece of text, with the
piece before them as context (the incremental scheme of Hugging Face's text-generation-
inference and vLLM), one decode() call per token. A byte-level tokenizer splits a Chinese character or an emoji over
several tokens; while the window ends inside such a character its decoding ends in U+FFFD,
and the text waits for the next token, so no half character is ever shown, not even when
the output is cut (max_tokens) in the middle of one.

Stop strings follow vLLM: a stop string ends the request and is not part of its text (the
token ids keep every generated token); while the request runs, a tail of the text that could
be the start of a stop string is held back, so nothing streamed is ever taken back. A token
that ends the request (the end-of-sequence token, or one of its stop_token_ids) is not part
of the text either (its id stays in the token ids, and in usage, as in vLLM): `finish(
drop_last=True)`. Its text was never handed out: it ends the step it came in.

That tail is tracked as the text grows, one Knuth-Morris-Pratt matcher per stop string (the
longest prefix of the stop string the text now ends with), so each token costs time in
proportion to its own characters, whatever the stop strings' length: testing every prefix
of every stop string against the text's end after each token would cost the square of
their length per token, on the thread that steps everyone.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what decode() gives for an incomplete UTF-8 sequence


def fast_decode(tokenizer):
    """ids -> text as `tokenizer.decode(ids, skip_special_tokens=False)` gives it. A Hugging
    Face fast tokenizer's decode is its Rust backend's, plus a clean-up of spaces when
    `clean_up_tokenization_spaces` is set; without that clean-up (the bundled tokenizer) the
    backend is called directly, several times cheaper a call (one call per token, every
    running request, every step)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if callable(getattr(backend, "decode", None)) and \
            getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


def prefix_function(s: str) -> list[int]:
    """pi[i]: the length of the longest proper prefix of s[:i + 1] that is also its suffix."""
    pi = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = pi[k - 1]
        if s[i] == s[k]:
            k += 1
        pi[i] = k
    return pi


def advance(s: str, pi: list[int], q: int, text: str) -> int:
    """The matcher of s after reading text, from q matched characters: how many characters
    of s the text now ends with (a whole match falls back to its longest border, so the
    result is always shorter than s)."""
    for ch in text:
        while q and s[q] != ch:
            q = pi[q - 1]
        if s[q] == ch:
            q += 1
            if q == len(s):
                q = pi[q - 1]
    return q


class Detokenizer:
    """One request's output text. `add` each new token; `take` the text a client may see."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.stop = [x for x in (stop or []) if x]  # an empty string stops nothing
        self._pi = [prefix_function(x) for x in self.stop]
        self._matched = [0] * len(self.stop)  # per stop string: its prefix the text ends with
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # window start: context for the tokens being decoded
        self.read_offset = 0  # tokens before this are in `text`
        self.prefix_text = ""  # the window's context tokens decoded: token_ids[prefix:read]
        self.text = ""  # decoded output so far, complete characters only
        self.stop_at: int | None = None  # where in `text` the first stop string begins
        self.sent = 0  # characters of visible text handed out by `take`
        self._decode = fast_decode(tokenizer)  # ids -> text

    def add(self, token_id: int) -> bool:
        """Append one token; True if the text now holds a complete stop string."""
        self.token_ids.append(token_id)
        window = self._decode(self.token_ids[self.prefix_offset:])
        before = self.prefix_text
        if len(window) <= len(before) or window.endswith(REPLACEMENT):
            return False  # inside a multi-byte character: wait for the rest of it
        old_len = len(self.text)
        new_text = window[len(before):]
        self.text += new_text
        # the new window starts after the tokens decoded before: its context is this text
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.prefix_text = new_text
        if self.stop and self.stop_at is None:
            self._matched = [advance(x, pi, q, new_text) for x, pi, q in
                             zip(self.stop, self._pi, self._matched)]
            # only a stop string ending in the new text can be new
            start = max(0, old_len - max(len(s) for s in self.stop) + 1)
            hits = [i for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                self.stop_at = min(hits)
                return True
        return False

    def visible(self, finished: bool) -> str:
        """The text a client may see: cut at a stop string; while running, without a tail
        that could still become one."""
        if self.stop_at is not None:
            return self.text[:self.stop_at]
        if finished:
            return self.text
        hold = max(self._matched, default=0)
        return self.text[:len(self.text) - hold]

    def finish(self, drop_last: bool = False) -> None:
        """The request ended: the text is now the whole output decoded once. An output cut
        (at max_tokens) inside a multi-byte character keeps that incomplete character back,
        as while running: the text ends at the last complete character, never in U+FFFD.
        `drop_last`: the last token ended it (EOS or a stop token id): its text is left out."""
        if self.stop_at is None:
            ids = self.token_ids[:-1] if drop_last else self.token_ids
            text = self._decode(ids)
            if text.endswith(REPLACEMENT) and self.read_offset < len(ids):
                # the tokens after read_offset never made a whole character
                text = self._decode(ids[:self.read_offset])
            self.text = text

    def take(self, finished: bool) -> str:
        """The visible text not handed out before."""
        text = self.visible(finished)
        new = text[self.sent:]
        self.sent = len(text)
        return new
