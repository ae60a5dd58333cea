"""Validation of what callers hand the engine, before anything is queued.

Owns the rules for prompts (string or token ids, length, encoding), request ids, and the
argument shapes `generate` accepts. Every rule raises ValueError saying what was wrong and
what is allowed. Pure checks: nothing here queues, tokenizes beyond the prompt itself, or
touches a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.config import SamplingParams

PromptInput = str | list[int]

# A prompt string longer than this many characters per token of max_model_len is refused
# before tokenizing (tokenizing 10 MB takes half a minute, with every command waiting). No
# tokenizer we know packs more than a few characters into a token on average, so a prompt
# this long cannot fit anyway.
MAX_CHARS_PER_TOKEN = 32
MAX_REQUEST_ID_LEN = 256


def check_request_id(request_id: Any) -> str:
    if not isinstance(request_id, str):
        raise ValueError(f"request_id must be a string, got {type(request_id).__name__}")
    if not request_id or len(request_id) > MAX_REQUEST_ID_LEN:
        raise ValueError(
            f"request_id must be 1 to {MAX_REQUEST_ID_LEN} characters, got {len(request_id)}"
        )
    return request_id


def prompt_ids(prompt: Any, tokenizer: Any, vocab_size: int, max_model_len: int) -> list[int]:
    """The prompt's token ids, or ValueError."""
    if isinstance(prompt, str):
        ids = _tokenize(prompt, tokenizer, max_model_len)
    elif isinstance(prompt, (list, tuple)):
        if not prompt:
            raise ValueError("prompt is empty; give a non-empty string or token id list")
        for t in prompt:
            if isinstance(t, bool) or not isinstance(t, int):
                raise ValueError(f"prompt token ids must be integers, got {t!r}")
            if not 0 <= t < vocab_size:
                raise ValueError(f"prompt token id {t} is outside the vocabulary [0, {vocab_size})")
        ids = list(prompt)
    else:
        raise ValueError(
            f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
        )
    if len(ids) >= max_model_len:
        raise ValueError(
            f"prompt has {len(ids)} tokens; max_model_len is {max_model_len}, so a "
            f"prompt may have at most {max_model_len - 1} tokens"
        )
    return ids


def _tokenize(prompt: str, tokenizer: Any, max_model_len: int) -> list[int]:
    if tokenizer is None:
        raise ValueError("this engine has no tokenizer: give prompts as token id lists")
    if not prompt:
        raise ValueError("prompt is empty; give a non-empty string or token id list")
    limit = MAX_CHARS_PER_TOKEN * max_model_len
    if len(prompt) > limit:
        raise ValueError(
            f"prompt has {len(prompt):,} characters; with max_model_len={max_model_len} it "
            f"cannot fit (prompts of more than {limit:,} characters are refused untokenized)"
        )
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"prompt is not valid text: {e.reason} at character {e.start} "
            f"({prompt[e.start:e.end]!r}); give a string that encodes as UTF-8"
        ) from None
    # A prompt that already starts with the BOS text (a rendered chat template) gets no
    # second BOS from the tokenizer.
    bos = getattr(tokenizer, "bos_token", None)
    special = not (isinstance(bos, str) and bos and prompt.startswith(bos))
    try:
        ids = list(tokenizer(prompt, add_special_tokens=special)["input_ids"])
    except Exception as e:
        raise ValueError(f"the tokenizer could not encode the prompt: {type(e).__name__}: {e}") \
            from e
    if not ids:
        raise ValueError("prompt tokenizes to no tokens; give a longer prompt")
    return ids


def generate_args(prompts: Any, params: Any) -> tuple[list[Any], list[Any]]:
    """Normalise generate()'s arguments to one prompt list and one params list of the same
    length; ValueError for anything else."""
    if isinstance(prompts, str) or (
        isinstance(prompts, (list, tuple)) and prompts
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts)
    ):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(
            "prompts must be a string, a list of token ids, or a list of those, got "
            f"{type(prompts).__name__}"
        )
    if not prompts:
        raise ValueError("prompts is empty; give at least one prompt")
    prompts = list(prompts)
    if isinstance(params, (list, tuple)):
        if len(params) != len(prompts):
            raise ValueError(
                f"got {len(prompts)} prompts and {len(params)} sampling params; give one "
                "SamplingParams (or dict) for all, or a list with one per prompt"
            )
        plist: Sequence[Any] = list(params)
    else:
        plist = [params] * len(prompts)
    return prompts, list(plist)


def sampling_params(params: Any, tokenizer: Any, vocab_size: int) -> SamplingParams:
    """Coerced and validated params, also against this engine (tokenizer, vocabulary)."""
    sp = SamplingParams.coerce(params)
    sp.validate()
    if sp.detokenize and tokenizer is None:
        raise ValueError("this engine has no tokenizer: submit with detokenize=False")
    for t in sp.stop_token_ids:
        if not 0 <= t < vocab_size:
            raise ValueError(
                f"stop token id {t} is outside the vocabulary [0, {vocab_size})"
            )
    return sp
