"""A model's chat template, read from its folder and applied to a conversation, without torch.

Owns turning a list of messages ({"role", "content"}) into the prompt text a chat model
expects, the way transformers' ``apply_chat_template(..., tokenize=False,
add_generation_prompt=True)`` does: the same Jinja environment (sandboxed, trim_blocks,
lstrip_blocks, loop controls, ``raise_exception``, ``strftime_now``, a JSON ``tojson``) and
the template file transformers saves (``chat_template.jinja``, or ``chat_template`` in
tokenizer_config.json). The dashboard uses it because importing transformers' tokenizers
imports torch, which the dashboard process must not do.

It never imports torch, transformers or streamlit, and never touches the network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

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
