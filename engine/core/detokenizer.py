"""Incremental detokenization and stop strings for one request.

Owns turning the next token id into the next piece of text without decoding the whole
output again each step (a sliding window of tokens, as vLLM does), and holding back just
enough text that a stop string split across tokens is never emitted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Decode = Callable[[list[int]], str]


def decoder_for(tokenizer: Any) -> Decode:
    """`ids -> tokenizer.decode(ids, skip_special_tokens=True)`, made cheap where it can be.

    transformers' fast tokenizers (TokenizersBackend) spend ~3/4 of a short decode in Python
    (argument conversion, kwargs) around the Rust call. Where the tokenizer's decode is
    exactly that wrapper around its backend and does no clean-up of spaces afterwards, the
    backend's own decode returns the same string: call it directly. Anything else (another
    tokenizer class, an override, clean-up on) keeps the public decode."""
    backend = getattr(tokenizer, "_tokenizer", None)
    cls = type(tokenizer)
    plain = (
        backend is not None
        and callable(getattr(backend, "decode", None))
        and _is(getattr(cls, "decode", None), "transformers.tokenization_utils_base",
                "PreTrainedTokenizerBase.decode")
        and _is(getattr(cls, "_decode", None), "transformers.tokenization_utils_tokenizers",
                "TokenizersBackend._decode")
        and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False
    )
    if plain:
        fast = backend.decode
        return lambda ids: fast(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def _is(fn: Any, module: str, qualname: str) -> bool:
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)) == (module,
                                                                                  qualname)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, stop: list[str] | None = None,
                 decode: Decode | None = None) -> None:
        """decode: `decoder_for(tokenizer)`, made once and shared (the step loop does)."""
        self.tokenizer = tokenizer
        self._decode = decode or decoder_for(tokenizer)
        self.stop = list(stop or [])
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self._emitted = 0

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
