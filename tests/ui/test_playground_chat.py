"""The Playground on the default model (config.yaml: SmolLM2-135M-Instruct, CPU here) speaks
chat: with the page's default settings (greedy) the reply to a question is right, a second
turn carries the system prompt and the first turn and finds the first turn's prompt in the
prefix cache, and the switch turns chat off (the prompt then goes verbatim). Prompts go as
token ids (typed text is plain text): the tests read them back as text.

Under AppTest with the dashboard's own cached client, as under `streamlit run app.py`.
Skips, saying why, when scripts/setup.sh has not made the default model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from engine.envs import GAPLESS_CONFIG
from engine.process.client import EngineClient
from ui.engine_link import _shared_client
from ui.widgets.chat_prompt import load_prompt_tokenizer

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "app.py"
SMOL = REPO / "models" / "SmolLM2-135M-Instruct"
TIMEOUT = 300  # the first run waits for the engine to load the model

if not (REPO / "models" / "SmolLM2-135M-Instruct" / "model.safetensors").is_file():
    pytest.skip("models/SmolLM2-135M-Instruct is missing: run `bash scripts/setup.sh`",
                allow_module_level=True)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[EngineClient, list[str]]]:
    """The default config's engine, and the prompts the pages submit to it."""
    cwd, env = os.getcwd(), os.environ.pop(GAPLESS_CONFIG, None)
    os.chdir(REPO)
    st.cache_resource.clear()
    try:
        at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
        assert not at.exception, at.exception
        client = _shared_client()
        submitted: list[str] = []
        submit = client.submit

        tok = load_prompt_tokenizer(SMOL)
        assert tok is not None

        def recording_submit(prompt: Any, *args: Any, **kwargs: Any) -> str:
            submitted.append(prompt if isinstance(prompt, str) else tok.decode(prompt))
            return submit(prompt, *args, **kwargs)

        client.submit = recording_submit  # type: ignore[method-assign]
        yield client, submitted
    finally:
        st.cache_resource.clear()  # on_release shuts the engine down
        os.chdir(cwd)
        if env is not None:
            os.environ[GAPLESS_CONFIG] = env


def playground() -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.run()
    at.switch_page("ui/pages/playground.py").run()
    at.slider(key="play.max_tokens").set_value(48)  # the other settings: the page's defaults
    return at


def test_chat_turns_go_through_the_template_with_the_history(engine) -> None:
    client, submitted = engine
    at = playground()
    assert at.toggle(key="play.chat").value is True and not at.toggle(key="play.chat").disabled
    at.text_area(key="play.system").set_value("You answer in one short sentence.")
    at.chat_input(key="play.prompt").set_value("What is the capital of France?").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    first = at.markdown[-1].value
    assert "Paris" in first, first
    assert "finished: stop" in at.caption[-1].value  # ended at <|im_end|>, not max tokens
    assert at.caption[-1].value.startswith("greedy · max 48 tokens")
    assert submitted[-1].startswith("<|im_start|>system\nYou answer in one short sentence.")
    assert submitted[-1].endswith("<|im_start|>assistant\n")

    at.chat_input(key="play.prompt").set_value("And of Italy?").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    second = submitted[-1]
    assert second.count("<|im_start|>user\n") == 2
    assert "What is the capital of France?" in second and first in second
    assert second.endswith("<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n")
    assert at.markdown[-1].value.strip(), "no reply to the second turn"
    # The second prompt starts with the first one: its full KV blocks come from the cache.
    prompt, cached = at.caption[-1].value.rsplit("prompt ", 1)[1].split(" tokens, ")
    assert 0 < int(cached.split()[0]) < int(prompt), at.caption[-1].value


def test_switching_chat_off_sends_the_prompt_verbatim(engine) -> None:
    _, submitted = engine
    at = playground()
    at.toggle(key="play.chat").set_value(False).run()
    at.chat_input(key="play.prompt").set_value("def fibonacci(n):").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert submitted[-1] == "def fibonacci(n):"
    assert at.code[-1].value.strip(), "the completion is empty"
