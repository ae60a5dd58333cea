"""Incremental detokenization and stop strings for one request.

Owns turning the next token id into the next piece of text without decoding the whole
output again each step (a sliding window of tokens, as vLLM does), and holding back just
enough text that a stop string split across tokens is never emitted.
"""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self._emitted = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add one token; returns (text that may be shown now, whether a stop string hit)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
        if self.stop:
            # Only the new tail can complete a stop string.
            start = max(0, self._emitted - self._holdback)
            for s in self.stop:
                i = self.text.find(s, start)
                if i != -1:
                    self.text = self.text[:i]
                    return self._take(len(self.text)), True
            return self._take(len(self.text) - self._holdback), False
        return self._take(len(self.text)), False

    def flush(self) -> str:
        """The text held back, at the end of the request."""
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        out = self.text[self._emitted : upto]
        self._emitted = upto
        return out
