"""Incremental detokenization and stop strings for one request.

Owns turning the next token id into the next piece of text without decoding the whole
output again each step (a sliding window of tokens, as vLLM does), holding back just
enough text that a stop string split across tokens is never emitted, and finding stop
strings: one automaton over all of them (StopMatcher) reads each new character once, so a
token costs the same whatever the number of stop strings.
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


class StopMatcher:
    """Aho-Corasick over a request's stop strings, fed the text one piece at a time: each
    character is read once (the state carries a match across pieces), and a match is found
    where it ends first, the longest one ending there when several do (the same whichever
    way the text was cut into tokens)."""

    def __init__(self, stop: list[str]) -> None:
        self._goto: list[dict[str, int]] = [{}]
        fail = [0]
        done = [0]  # per state: length of the longest stop string ending there (0: none)
        for word in stop:
            state = 0
            for ch in word:
                nxt = self._goto[state].get(ch)
                if nxt is None:
                    nxt = len(self._goto)
                    self._goto[state][ch] = nxt
                    self._goto.append({})
                    fail.append(0)
                    done.append(0)
                state = nxt
            done[state] = len(word)
        queue = list(self._goto[0].values())
        for state in queue:  # breadth first: a state's fail link is shallower
            for ch, nxt in self._goto[state].items():
                f = fail[state]
                while ch not in self._goto[f] and f:
                    f = fail[f]
                fail[nxt] = self._goto[f].get(ch, 0)
                if not done[nxt]:
                    done[nxt] = done[fail[nxt]]
                queue.append(nxt)
        self._fail = fail
        self._done = done
        self._state = 0

    def feed(self, text: str) -> tuple[int, int] | None:
        """(index in ``text`` where a stop string ends, its length), or None."""
        goto, fail, done = self._goto, self._fail, self._done
        state = self._state
        for i, ch in enumerate(text):
            while True:
                nxt = goto[state].get(ch)
                if nxt is not None:
                    state = nxt
                    break
                if not state:
                    break
                state = fail[state]
            if done[state]:
                self._state = state
                return i, done[state]
        self._state = state
        return None


class IncrementalDetokenizer:
    """The text so far is kept as settled pieces (emitted, and out of reach of any stop
    string) and a short live tail, so a token costs the same at the 10,000th token as at
    the first (appending to one growing string copies all of it each time)."""

    # Settle the tail's head into pieces once it is this long: fewer, larger pieces.
    SETTLE_CHARS = 256

    def __init__(self, tokenizer: Any, stop: list[str] | None = None,
                 decode: Decode | None = None) -> None:
        """decode: `decoder_for(tokenizer)`, made once and shared (the step loop does)."""
        self.tokenizer = tokenizer
        self._decode = decode or decoder_for(tokenizer)
        self.stop = list(stop or [])
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self._matcher = StopMatcher(self.stop) if self.stop else None
        self._fed = 0  # text[:_fed] went through the matcher
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._settled: list[str] = []  # text[:_base], emitted, no stop string can reach it
        self._base = 0
        self._tail = ""  # text[_base:]
        self._emitted = 0  # text[:_emitted] was handed out

    @property
    def text(self) -> str:
        """All the text so far (up to a stop string, which is not part of it)."""
        return "".join(self._settled) + self._tail

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add one token; returns (text that may be shown now, whether a stop string hit)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._tail += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
        end = self._base + len(self._tail)
        if self._matcher is not None:
            fed = self._fed
            hit = self._matcher.feed(self._tail[fed - self._base :])
            self._fed = end
            if hit is not None:
                i = fed + hit[0] + 1 - hit[1] - self._base  # where the stop string begins
                self._tail = self._tail[:i]
                return self._take(self._base + i), True
            return self._take(end - self._holdback), False
        return self._take(end), False

    def flush(self) -> str:
        """The text held back, at the end of the request."""
        return self._take(self._base + len(self._tail))

    def _take(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        out = self._tail[self._emitted - self._base : upto - self._base]
        self._emitted = upto
        cut = max(0, upto - self._holdback) - self._base  # what no stop string can reach
        if cut >= self.SETTLE_CHARS:
            self._settled.append(self._tail[:cut])
            self._tail = self._tail[cut:]
            self._base += cut
        return out
