"""The Playground's prompts as token ids, so that what a person types is always plain text.

Owns turning a prompt (plain text, or a conversation through ui.chat's template) into the
token ids the engine receives. Sent as a string, the engine's tokenizer would read a typed
``<|im_start|>`` as the control token it names: a user could open a turn of their own (the
model "became a pirate", issue 25). Here the template's own text is tokenized with its
special tokens, and the user's text with special tokens split into ordinary pieces
(tokenizers' ``encode_special_tokens``, what transformers calls ``split_special_tokens``).

It reads the model folder's ``tokenizer.json`` with the ``tokenizers`` library (no torch, no
transformers, no streamlit, no network). A model without that file (a hub id, a fake) gets
None from ``load_prompt_tokenizer``: the page then sends text and says so.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from ui.chat import ChatTemplate

# Stands in for a message's content while the template renders, so the content's place in
# the rendered text is known exactly (NUL never appears in a template's own text).
_SENTINEL = "\x00gapless-content-{}\x00"


@dataclass(frozen=True, slots=True)
class PromptIds:
    """A prompt's token ids and the text they spell (for showing, logging and tests)."""

    ids: list[int]
    text: str


class PromptTokenizer:
    """Two copies of one tokenizer: one reads special tokens (the template's text), the
    other splits them into plain pieces (what a person typed). Thread-safe: the copies are
    never reconfigured after construction."""

    def __init__(self, tokenizer_json: str, bos_token: str | None = None) -> None:
        self._template = Tokenizer.from_str(tokenizer_json)
        self._plain = Tokenizer.from_str(tokenizer_json)
        self._plain.encode_special_tokens = True
        self.bos_token = bos_token
        self._lock = threading.Lock()  # Tokenizer objects are not documented as thread-safe

    def special_ids(self) -> set[int]:
        """The ids of the tokenizer's special (added, special=True) tokens."""
        return {i for i, t in self._template.get_added_tokens_decoder().items() if t.special}

    def plain(self, text: str) -> PromptIds:
        """A completion prompt: the whole text is plain, with the model's usual BOS/EOS
        additions (as the engine adds them to a string prompt)."""
        with self._lock:
            enc = self._plain.encode(text, add_special_tokens=True)
        return PromptIds(list(enc.ids), text)

    def plain_ids(self, text: str) -> list[int]:
        """``text`` as plain text, nothing added: a user's part of a chat prompt."""
        with self._lock:
            return list(self._plain.encode(text, add_special_tokens=False).ids)

    def chat(self, template: ChatTemplate, messages: list[dict[str, str]]) -> PromptIds:
        """The conversation through ``template``: the template's text read with its control
        tokens, each message's content as plain text. ValueError when the template changes
        a message's text so that its place cannot be found."""
        real = template.render(messages)
        pieces = _pieces(template, messages, real)
        # As the engine does for a string prompt: no second BOS when the text starts with it.
        special = not (self.bos_token and real.startswith(self.bos_token))
        with self._lock:
            parts = [(self._plain if plain else self._template).encode(
                piece, add_special_tokens=False) for piece, plain in pieces if piece]
            merged = Encoding.merge(parts, growing_offsets=True) if parts else None
            if merged is None:
                raise ValueError("the chat template rendered an empty prompt")
            if special:
                merged = self._template.post_process(merged, add_special_tokens=True)
        return PromptIds(list(merged.ids), real)

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return self._template.decode(ids, skip_special_tokens=False)


def _pieces(template: ChatTemplate, messages: list[dict[str, str]],
            real: str) -> list[tuple[str, bool]]:
    """``real`` cut into (text, is the user's) pieces, found by rendering with sentinels in
    place of the contents: the template's text between them is the template's own."""
    marked = [dict(m, content=_SENTINEL.format(i)) for i, m in enumerate(messages)]
    rendered = template.render(marked)
    pieces: list[tuple[str, bool]] = []
    rest = rendered
    for i, m in enumerate(messages):
        sentinel = _SENTINEL.format(i)
        if rest.count(sentinel) != 1:
            raise ValueError(
                f"the chat template uses message {i}'s text {rest.count(sentinel)} times "
                "(or changes it): the Playground cannot tell its text from the template's")
        before, rest = rest.split(sentinel, 1)
        pieces += [(before, False), (m["content"], True)]
    pieces.append((rest, False))
    if "".join(p for p, _ in pieces) != real:
        raise ValueError("the chat template changes the messages' text (trims or escapes "
                         "it): the Playground cannot tell its text from the template's")
    return pieces


def load_prompt_tokenizer(model: str | Path) -> PromptTokenizer | None:
    """The tokenizer of a local model folder (``tokenizer.json``), or None without one."""
    folder = Path(model).expanduser()
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    return _load(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=4)
def _load(path: str, _mtime_ns: int) -> PromptTokenizer:
    bos = None
    try:
        config = json.loads((Path(path).parent / "tokenizer_config.json").read_text("utf-8"))
        bos = config.get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
    except (OSError, ValueError, AttributeError):
        pass
    return PromptTokenizer(Path(path).read_text("utf-8"),
                           bos if isinstance(bos, str) and bos else None)
