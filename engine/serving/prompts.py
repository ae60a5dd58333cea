"""From a validated OpenAI request to what the engine takes: prompt token ids and SamplingParams.

Owns tokenizing in the HTTP process (the engine's own tokenizer, loaded from the same
folder, so the ids are the ones the engine would make), the model's chat template, and the
length rules a client is told about up front: a prompt fits in max_model_len - 1 tokens,
and prompt + max_tokens fits in max_model_len. Prompts go to the engine as token ids, so
the engine process never tokenizes for HTTP clients. It must never talk to the engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engine.config import SamplingParams
from engine.serving.schema import ApiError, ChatCompletionRequest, CompletionRequest

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_OVERHEAD_FALLBACK = 16  # characters a message's header and footer count, if unmeasured


def load_tokenizer(source: str, *, trust_remote_code: bool = False,
                   chat_template: str | None = None) -> Any:
    """The model's tokenizer, as engine/model/loader.py loads it (a local folder is always
    offline). ``chat_template``: a file holding a Jinja template, or the template itself,
    to use instead of (or where there is no) model's own."""
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    local = Path(source).expanduser()
    if local.is_dir():
        source = str(local)
    if local.is_dir() or offline:
        kwargs["local_files_only"] = True
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as e:
        raise ValueError(f"could not load the tokenizer of {source!r}: {e}") from e
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    return tokenizer


def read_chat_template(template: str) -> str:
    """A template given inline (it holds Jinja's braces) or the file holding one; a name
    that is neither is an error, not a template that would print the name."""
    if "{" in template:
        return template
    path = Path(template).expanduser()
    if not path.is_file():
        raise ValueError(f"chat template file {template!r} does not exist (give a file, or "
                         "the Jinja template itself)")
    return path.read_text()


class PromptBuilder:
    """Turns requests into (prompt ids, SamplingParams) for one model and max_model_len."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    # ------------------------------------------------------------------------ prompts
    def completion_ids(self, req: CompletionRequest) -> list[int]:
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise ApiError(400, f"prompt holds {len(prompt)} prompts; this server takes "
                                    "one prompt per request (a string or a list of token ids)",
                               param="prompt")
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "prompt is empty; give a non-empty string or list of token ids",
                           param="prompt")
        if isinstance(prompt, str):
            ids = list(self.tokenizer(prompt)["input_ids"])
            if not ids:
                raise ApiError(400, "prompt tokenizes to no tokens; give a longer prompt",
                               param="prompt")
            return ids
        vocab = len(self.tokenizer)
        for t in prompt:
            if not 0 <= t < vocab:
                raise ApiError(400, f"prompt token id {t} is outside the vocabulary "
                                    f"[0, {vocab})", param="prompt")
        return list(prompt)

    def chat_ids(self, req: ChatCompletionRequest, model: str) -> list[int]:
        if not self.has_chat_template:
            raise ApiError(400, f"model {model!r} has no chat template, so /v1/chat/completions "
                                "cannot format messages; use /v1/completions with a plain "
                                "prompt, or start the server with --chat-template FILE",
                           param="messages")
        messages = []
        for m in req.messages:
            extra = {k: v for k, v in (m.model_extra or {}).items() if isinstance(v, str)}
            messages.append({**extra, "role": m.role, "content": m.text()})
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as e:  # a template may raise on what it cannot format
            raise ApiError(400, f"the chat template cannot format these messages: {e}",
                           param="messages") from None
        # The template writes any special tokens itself (BOS...): add none on top.
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ApiError(400, "the messages format to an empty prompt", param="messages")
        return ids

    def chat_overhead_chars(self) -> tuple[int, int]:
        """(characters the chat template writes once, characters it writes around each
        message): what tokenizing a chat reads beside the messages' own text, content-less
        messages included. Measured once by formatting empty messages; a template that
        refuses them counts CHAT_OVERHEAD_FALLBACK a message."""
        if not self.has_chat_template:
            return 0, 0

        def chars(roles: list[str]) -> int:
            return len(self.tokenizer.apply_chat_template(
                [{"role": r, "content": ""} for r in roles], tokenize=False,
                add_generation_prompt=True))
        try:
            one = chars(["user"])
            three = chars(["user", "assistant", "user"])
        except Exception:  # a template may raise on what it cannot format
            return 0, CHAT_OVERHEAD_FALLBACK
        return one, max(1, (three - one) // 2)

    # ----------------------------------------------------------------------- sampling
    def sampling(self, req: CompletionRequest | ChatCompletionRequest, prompt_len: int,
                 ) -> SamplingParams:
        """SamplingParams for the request, after the length checks. ValueError (with the
        engine's own wording) for values SamplingParams refuses."""
        room = self.max_model_len - prompt_len
        if room < 1:
            raise ApiError(400, f"this model's maximum context length is {self.max_model_len} "
                                f"tokens and the prompt has {prompt_len}; a prompt may have at "
                                f"most {self.max_model_len - 1} tokens", param="prompt")
        if isinstance(req, ChatCompletionRequest):
            limit, name = req.token_limit, ("max_completion_tokens"
                                            if req.max_completion_tokens is not None
                                            else "max_tokens")
            max_tokens = room if limit is None else limit
        else:
            limit, name = req.max_tokens, "max_tokens"
            max_tokens = min(COMPLETION_DEFAULT_MAX_TOKENS, room) if limit is None else limit
        if max_tokens < 1:
            raise ApiError(400, f"{name} must be >= 1, got {max_tokens}", param=name)
        if max_tokens > room:
            raise ApiError(400, f"{name} is too large: this model's maximum context length is "
                                f"{self.max_model_len} tokens and the prompt has {prompt_len}, "
                                f"so {name} may be at most {room} (got {max_tokens})",
                           param=name)
        stop = [req.stop] if isinstance(req.stop, str) else req.stop
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            seed=req.seed,
            stop=stop or None,
            ignore_eos=req.ignore_eos,
        )
        try:
            params.validate()
        except ValueError as e:
            raise ApiError(400, str(e), param=str(e).split(" ", 1)[0]) from None
        return params
