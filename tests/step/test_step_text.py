"""engine/step/text.py without a model: the stop rule a user sees as finish_reason, and a
request's text (held back, flushed at the end, stop strings, one decoder per tokenizer)."""

from __future__ import annotations

import pytest
from tiny_models import make_tokenizer

from engine.config import SamplingParams
from engine.core.request import Request
from engine.step.text import RequestText, stop_reason

EOS = 2


def request(prompt_len: int = 3, **params) -> Request:
    return Request("r", list(range(10, 10 + prompt_len)), SamplingParams(**params), 0, 0)


def after(req: Request, *tokens: int) -> Request:
    req.output_token_ids += tokens
    return req


@pytest.mark.parametrize("params,token,expected", [
    ({}, EOS, "stop"),
    ({"ignore_eos": True}, EOS, None),
    ({"stop_token_ids": [7]}, 7, "stop"),
    ({"stop_token_ids": [7], "ignore_eos": True}, 7, "stop"),  # ignore_eos is about EOS only
    ({}, 5, None),
    ({"max_tokens": 1}, 5, "length"),
])
def test_stop_reason(params, token, expected):
    assert stop_reason(after(request(**params), token), token, {EOS}, 100) == expected


def test_the_models_length_ends_a_request_before_max_tokens():
    req = after(request(prompt_len=8, max_tokens=50), 5, 6)
    assert stop_reason(req, 6, {EOS}, max_model_len=11) is None
    assert stop_reason(after(req, 6), 6, {EOS}, max_model_len=11) == "length"


def test_text_is_the_decoded_tokens_and_close_flushes_what_was_held():
    tok = make_tokenizer()
    ids = tok.encode("hello world, hello", add_special_tokens=False)
    text = RequestText(tok)
    req = request()
    pieces = [text.push(req, t)[0] for t in ids]
    rest = text.close(req)
    assert "".join(pieces) + rest == req.text == tok.decode(ids)
    assert text.close(req) == ""  # nothing of it is kept


def test_a_stop_string_is_reported_by_push():
    tok = make_tokenizer()
    ids = tok.encode("hello world, hello", add_special_tokens=False)
    text = RequestText(tok)
    req = request(stop=["world"])
    hits = [text.push(req, t)[1] for t in ids]
    assert any(hits)


def test_one_decoder_per_tokenizer_and_a_new_one_when_it_changes():
    a, b = make_tokenizer(), make_tokenizer()
    text = RequestText(a)
    assert text.decoder() is text.decoder()
    first = text.decoder()
    text.tokenizer = b
    assert text.decoder() is not first
