"""A conversation as the prompt a chat model receives: the model's chat template, read from its
folder and applied to the messages, and the prompt's token ids, without torch.

Owns turning a list of messages ({"role", "content"}) into the prompt text a chat model
expects, the way transformers' ``apply_chat_template(..., tokenize=False,
add_generation_prompt=True)`` does: the same Jinja environment (sandboxed, trim_blocks,
lstrip_blocks, loop controls, ``raise_exception``, ``strftime_now``, a JSON ``tojson``) and
the template file transformers saves (``chat_template.jinja``, or ``chat_template`` in
tokenizer_config.json). The dashboard uses it because importing transformers' tokenizers
imports torch, which the dashboard process must not do.

Owns too the Playground's prompts as token ids, so that what a person types is always plain
text. Sent as a string, the engine's tokenizer would read a typed ``<|im_start|>`` as the
control token it names: a user could open a turn of their own. Here the template's own text
is tokenized with its special tokens, and the user's text with special tokens split into
ordinary pieces (tokenizers' ``encode_special_tokens``, what transformers calls
``split_special_tokens``), from the model folder's ``tokenizer.json`` with the ``tokenizers``
library. A model without that file (a hub id, a fake) gets None from
``load_prompt_tokenizer``: the page then sends text and says so.

It never imports torch, transformers or streamlit, and never touches the network.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Encoding, Tokenizer

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    source: str
    special_tokens: dict[str, str]

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for `messages`, ending where the assistant's reply starts."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(
                m.get("content"), str
            ):
                raise ValueError(
                    f"message {i} must be a dict with role in {ROLES} and a string content, "
                    f"got {m!r}"
                )
        if not messages:
            raise ValueError("a conversation needs at least one message")
        template = _environment().from_string(self.source)
        return template.render(messages=messages, add_generation_prompt=True,
                               **self.special_tokens)


def load_chat_template(model: str | Path) -> ChatTemplate | None:
    """The chat template of a local model folder; None when it has none (or is no folder)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    config = _read_json(folder / "tokenizer_config.json")
    source = None
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    else:
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        return None
    tokens = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):  # older files store AddedToken as a dict
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return ChatTemplate(source, tokens)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant tokens for training):
    rendered as its body, as transformers does when not tracking."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


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
