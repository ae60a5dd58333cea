"""After the engine process is killed (-9), the requests it held end "error" with what the
client knew of them: the prompt's token ids, the tokens and text that had arrived."""

from __future__ import annotations

import os
import signal

from serve_process import MODEL, ROOT

from engine.config import SamplingParams
from engine.process.client import EngineClient


def test_prompt_token_ids_survive_a_kill_9():
    prompt = list(range(5, 45))
    with EngineClient(None, model=str(ROOT / MODEL), device="cpu") as client:
        rid = client.submit(prompt, SamplingParams(max_tokens=1000, temperature=0.0,
                                                   ignore_eos=True))
        stream = client.stream(rid)
        first = next(stream)
        os.kill(client.pid, signal.SIGKILL)
        rest = "".join(stream)
        out = client.result(rid)
    assert out.finish_reason == "error" and "SIGKILL" in (out.error or "")
    assert out.prompt_token_ids == prompt
    assert out.token_ids and out.text == first + rest
