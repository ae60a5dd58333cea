"""A running request's text, and when a token ends it: the step loop's per-token rules.

Owns the incremental detokenizer of every running request that asks for text (one decoder
per tokenizer, made once and shared by every request: ``decoder_for``), and ``stop_reason``,
the pure rule that ends a request after a token: EOS (unless ``ignore_eos``), a stop token id,
``max_tokens``, or the model's length. A stop string is the detokenizer's to find.

Runs on the step loop's thread, one token at a time. It never hands text to a request's sink
(the loop does, so a sink's fault stays the loop's to judge), never touches the scheduler,
and holds nothing of a request after ``close``.
"""

from __future__ import annotations

from typing import Any

from engine.core.detokenizer import Decode, IncrementalDetokenizer, decoder_for
from engine.core.request import Request


class RequestText:
    """The open detokenizers of the requests that asked for text (``params.detokenize``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._decoder: tuple[Any, Decode] | None = None  # (tokenizer, its decoder_for)
        self._open: dict[str, IncrementalDetokenizer] = {}

    def push(self, req: Request, token: int) -> tuple[str, bool]:
        """The text this token adds ("" while the detokenizer holds it back), and whether
        it completed one of the request's stop strings. May raise (a tokenizer's fault):
        that belongs to this request alone."""
        detok = self._open.get(req.request_id)
        if detok is None:
            detok = self._open[req.request_id] = IncrementalDetokenizer(
                self.tokenizer, req.params.stop, self.decoder())
        return detok.push(token)

    def close(self, req: Request) -> str:
        """The request ended: its full text goes to ``req.text``; returns the text still held
        back ("" when none, or when the request never asked for text)."""
        detok = self._open.pop(req.request_id, None)
        if detok is None:
            return ""
        rest = detok.flush()
        req.text = detok.text
        return rest

    def decoder(self) -> Decode:
        """The tokenizer's decoder, made once per tokenizer and shared by every request."""
        if self._decoder is None or self._decoder[0] is not self.tokenizer:
            self._decoder = (self.tokenizer, decoder_for(self.tokenizer))
        return self._decoder[1]


def stop_reason(req: Request, token: int, eos_ids: set[int], max_model_len: int) -> str | None:
    """Why ``token``, just appended to ``req``'s output, ends the request ("stop" or
    "length"), or None when it goes on."""
    p = req.params
    if (not p.ignore_eos and token in eos_ids) or token in p.stop_token_ids:
        return "stop"
    if len(req.output_token_ids) >= p.max_tokens:
        return "length"
    if req.prompt_len + len(req.output_token_ids) >= max_model_len:
        return "length"
    return None
