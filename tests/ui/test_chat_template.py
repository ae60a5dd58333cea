"""ui.widgets.chat_prompt renders a model folder's chat template as transformers'
apply_chat_template does, without torch, and says when a folder has none (the Playground
then offers completion only).
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from ui.widgets.chat_prompt import load_chat_template

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "models" / "gapless-tiny-python"
# Uses what real templates use: bos_token, tojson, loop controls, raise_exception, a default
# system message, the generation prompt, and whitespace that trim_blocks/lstrip_blocks drop.
TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}<sys>default</sys>{% endif %}"
    "{% for m in messages %}\n    {% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('bad role') }}{% endif %}"
    "{% if m['content'] == 'skip me' %}{% continue %}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] | tojson }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi ü \"q\""},
     {"role": "assistant", "content": "skip me"}, {"role": "user", "content": "Again?"}],
]


@pytest.fixture(scope="module")
def saved_with_template(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model's tokenizer with TEMPLATE, saved by transformers; and the tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    tok.chat_template = TEMPLATE
    folder = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(str(folder))
    return folder, tok


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "multi-turn"])
def test_rendering_matches_transformers(saved_with_template, messages) -> None:
    folder, tok = saved_with_template
    template = load_chat_template(folder)
    assert template is not None
    want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert template.render(messages) == want


def test_the_template_in_tokenizer_config_is_found_too(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>"}, "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[-1]['content'] }}"}]}))
    template = load_chat_template(tmp_path)
    assert template is not None
    assert template.render([{"role": "user", "content": "hi"}]) == "<s>hi"


def test_no_template_means_none(tmp_path: Path) -> None:
    assert load_chat_template(TINY) is None  # the tiny model has none: completion only
    assert load_chat_template(tmp_path) is None
    assert load_chat_template(tmp_path / "missing") is None
    assert load_chat_template("HuggingFaceTB/not-a-local-folder") is None


def test_bad_conversations_are_refused_with_the_reason(saved_with_template) -> None:
    template = load_chat_template(saved_with_template[0])
    assert template is not None
    with pytest.raises(ValueError, match="at least one message"):
        template.render([])
    with pytest.raises(ValueError, match="message 0 must be a dict with role"):
        template.render([{"role": "user"}])
    with pytest.raises(ValueError, match="role in"):
        template.render([{"role": "tool", "content": "x"}])
    bad = type(template)("{{ raise_exception('no system prompt here') }}", {})
    with pytest.raises(jinja2.TemplateError, match="no system prompt here"):
        bad.render([{"role": "user", "content": "x"}])
