"""The cheap decode path gives exactly the tokenizer's own decode, and the incremental
detokenizer built on it emits the same text and stops at the same token."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tiny_models import make_tokenizer

from engine.core.detokenizer import IncrementalDetokenizer, decoder_for

MODELS = Path(__file__).resolve().parents[2] / "models"


def tokenizers():
    from transformers import AutoTokenizer

    out = [("tiny-test", make_tokenizer())]
    for name in ("gapless-tiny-python", "SmolLM2-135M-Instruct"):
        if (MODELS / name / "tokenizer.json").is_file():
            out.append((name, AutoTokenizer.from_pretrained(MODELS / name)))
    return out


TOKENIZERS = tokenizers()


def public(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("name,tok", TOKENIZERS, ids=[n for n, _ in TOKENIZERS])
def test_the_cheap_decode_equals_the_tokenizers_decode(name, tok):
    rng = random.Random(0)
    fast, n = decoder_for(tok), len(tok)
    special = list(tok.all_special_ids)
    for _ in range(300):
        ids = [rng.randrange(n) for _ in range(rng.randrange(0, 12))]
        if special and rng.random() < 0.3:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(special))
        assert fast(ids) == tok.decode(ids, skip_special_tokens=True), ids


def test_a_tokenizer_that_overrides_decode_keeps_its_own():
    tok = make_tokenizer()

    class Shouting(type(tok)):
        def decode(self, ids, skip_special_tokens=False, **kw):
            return super().decode(ids, skip_special_tokens=skip_special_tokens).upper()

    tok.__class__ = Shouting
    ids = tok.encode("print(os.getcwd())")
    assert decoder_for(tok)(ids) == "PRINT(OS.GETCWD())"


def test_clean_up_of_spaces_keeps_the_public_decode():
    tok = make_tokenizer()
    tok.clean_up_tokenization_spaces = True
    seen = []
    real = tok.decode

    def spy(ids, **kw):
        seen.append(list(ids))
        return real(ids, **kw)

    tok.decode = spy
    decoder_for(tok)([5, 6])
    assert seen == [[5, 6]]


@pytest.mark.parametrize("name,tok", TOKENIZERS, ids=[n for n, _ in TOKENIZERS])
def test_incremental_text_and_stops_are_the_same_on_the_cheap_path(name, tok):
    text = (MODELS.parent / "engine" / "core" / "scheduler.py").read_text()[:3000]
    ids = tok.encode(text, add_special_tokens=False)
    rng = random.Random(1)
    for trial in range(40):
        start = rng.randrange(len(ids) - 80)
        stream = ids[start : start + rng.randrange(1, 80)]
        piece = tok.decode(stream, skip_special_tokens=True)
        stop = [piece[len(piece) // 2 :][:4]] if trial % 2 and len(piece) > 8 else ["\0never"]
        runs = []
        for decode in (decoder_for(tok), public(tok)):
            d = IncrementalDetokenizer(tok, stop, decode)
            deltas, stopped_at = [], None
            for i, t in enumerate(stream):
                delta, hit = d.push(t)
                deltas.append(delta)
                if hit:
                    stopped_at = i
                    break
            deltas.append(d.flush())
            runs.append((deltas, stopped_at, d.text))
        assert runs[0] == runs[1]


class OneStringDetokenizer:
    """The detokenizer as it was before its text was split into settled pieces and a tail:
    one string, appended to at every token (the reference)."""

    def __init__(self, decode, stop):
        self._decode, self.stop = decode, list(stop or [])
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids, self._prefix_offset, self._read_offset = [], 0, 0
        self.text, self._emitted = "", 0

    def push(self, token_id):
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
        if self.stop:
            start = max(0, self._emitted - self._holdback)
            for s in self.stop:
                i = self.text.find(s, start)
                if i != -1:
                    self.text = self.text[:i]
                    return self._take(len(self.text)), True
            return self._take(len(self.text) - self._holdback), False
        return self._take(len(self.text)), False

    def flush(self):
        return self._take(len(self.text))

    def _take(self, upto):
        if upto <= self._emitted:
            return ""
        out = self.text[self._emitted : upto]
        self._emitted = upto
        return out


@pytest.mark.parametrize("settle", [1, 7, IncrementalDetokenizer.SETTLE_CHARS])
def test_settled_pieces_give_the_text_deltas_and_stops_of_one_string(settle, monkeypatch):
    monkeypatch.setattr(IncrementalDetokenizer, "SETTLE_CHARS", settle)
    tok = make_tokenizer()
    decode = decoder_for(tok)
    text = (MODELS.parent / "engine" / "core" / "scheduler.py").read_text()
    ids = tok.encode(text, add_special_tokens=False)
    rng = random.Random(2)
    hits = 0
    for trial in range(60):
        start = rng.randrange(len(ids) - 400)
        stream = ids[start : start + rng.randrange(1, 400)]
        whole = tok.decode(stream, skip_special_tokens=True)
        stop = None
        if trial % 3:  # a piece of the text (it hits), of 1 to 12 characters, or never
            at, n = rng.randrange(len(whole) or 1), rng.randint(1, 12)
            stop = [whole[at : at + n] or "\0", "\0never"]
        runs = []
        for d in (IncrementalDetokenizer(tok, stop, decode), OneStringDetokenizer(decode, stop)):
            out = []
            for t in stream:
                delta, hit = d.push(t)
                out.append((delta, hit))
                if hit:
                    break
            out.append((d.flush(), None))
            runs.append((out, d.text))
        assert runs[0] == runs[1], f"trial {trial}"
        hits += any(hit for _, hit in runs[0][0])
    assert hits > 10, "the trials must hit stop strings"
