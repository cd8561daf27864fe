"""Token ids -> text, a few tokens at a time, and the stop-string rule.

Decoding a request's whole output again after every token costs time in proportion to its
length, for every request, every step. Instead each request keeps a `Detokenizer` that
decodes only a short window: the tokens since the last complete piece of text, with the
piece before them as context (the incremental scheme of Hugging Face's text-generation-
inference and vLLM), one decode() call per token. A byte-level tokenizer splits a Chinese character or an emoji over
several tokens; while the window ends inside such a character its decoding ends in U+FFFD,
and the text waits for the next token, so no half character is ever shown.

Stop strings follow vLLM: a stop string ends the request and is not part of its text (the
token ids keep every generated token); while the request runs, a tail of the text that could
be the start of a stop string is held back, so nothing streamed is ever taken back.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what decode() gives for an incomplete UTF-8 sequence


def fast_decode(tokenizer):
    """ids -> text as `tokenizer.decode(ids, skip_special_tokens=False)` gives it. A Hugging
    Face fast tokenizer's decode is its Rust backend's, plus a clean-up of spaces when
    `clean_up_tokenization_spaces` is set; without that clean-up (the bundled tokenizer) the
    backend is called directly: 0.7 instead of 2.5 us a call (one call per token, every
    running request, every step)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if callable(getattr(backend, "decode", None)) and \
            getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


class Detokenizer:
    """One request's output text. `add` each new token; `take` the text a client may see."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.stop = list(stop or [])
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
        hold = max((k for s in self.stop for k in range(1, len(s))
                    if self.text.endswith(s[:k])), default=0)
        return self.text[:len(self.text) - hold]

    def finish(self) -> None:
        """The request ended: the text is now the whole output decoded once, less an
        incomplete character at the very end (an answer cut at max_tokens inside a Chinese
        character or an emoji): decode() gives U+FFFD for it, which is no character the
        model wrote. Its token ids stay in `token_ids`."""
        if self.stop_at is None:
            text = self._decode(self.token_ids)
            if text.endswith(REPLACEMENT) and not self.text.endswith(REPLACEMENT):
                text = text.rstrip(REPLACEMENT)
            self.text = text

    def take(self, finished: bool) -> str:
        """The visible text not handed out before."""
        text = self.visible(finished)
        new = text[self.sent:]
        self.sent = len(text)
        return new
