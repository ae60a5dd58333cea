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
