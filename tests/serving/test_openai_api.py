"""The official `openai` client against a real `python -m engine serve`: completions and chat,
streamed and not, usage counts as the tokenizer counts them, stop strings and seeds, and
every bad request answered in OpenAI's error shape with its status and a message that says
what is allowed, the server serving on afterwards."""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_process import API_KEY, MODEL, SERVED

PROMPT = "def fibonacci(n):"
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True})


def test_models_and_health(server, oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [SERVED]  # its folder's name; MODEL works too
    assert models.data[0].model_extra["max_model_len"] == 1024
    r = httpx.get(f"{server.url}/health", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_completion_usage_counts_the_tokenizers_tokens(oai, tokenizer):
    out = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **GREEDY)
    assert out.object == "text_completion" and out.model == SERVED
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert out.usage.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    # Greedy: the same request gives the same text again.
    again = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **GREEDY)
    assert again.choices[0].text == choice.text


def test_completion_takes_token_ids_as_the_prompt(oai, tokenizer):
    ids = tokenizer(PROMPT)["input_ids"]
    by_ids = oai.completions.create(model=MODEL, prompt=ids, max_tokens=8, **GREEDY)
    by_text = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_streamed_completion_equals_the_whole_one(oai):
    whole = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, **GREEDY)
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 1, "the answer came in one piece, not streamed"
    assert "".join(texts) == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(oai):
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, stream=True,
                                         **GREEDY))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_chat_applies_the_template_and_counts_its_tokens(oai, tokenizer):
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "user", "content": "def add(a, b):"}]
    out = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, **GREEDY)
    assert out.object == "chat.completion"
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content
    rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)
                                          ["input_ids"])
    assert out.usage.completion_tokens == 10 and out.choices[0].finish_reason == "length"
    # The same rendered prompt through /v1/completions gives the same greedy answer.
    plain = oai.completions.create(model=MODEL, prompt=rendered, max_tokens=10, **GREEDY)
    assert plain.choices[0].text == msg.content


def test_streamed_chat_equals_the_whole_one(oai):
    messages = [{"role": "user", "content": "import os"}]
    whole = oai.chat.completions.create(model=MODEL, messages=messages,
                                        max_completion_tokens=16, **GREEDY)
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=16, stream=True,
        stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 16 == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_without_max_tokens_fills_the_context(oai, tokenizer):
    """Chat's default max_tokens is what is left of max_model_len (1024)."""
    words = 1
    while True:  # a message whose rendered prompt leaves room for 5 tokens
        messages = [{"role": "user", "content": "x " * words}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
        n = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        if n >= 1024 - 5:
            break
        words += max(1, (1024 - 5 - n) // 2)
    assert n < 1024, "overshot: the prompt alone fills the context"
    out = oai.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert out.usage.prompt_tokens == n
    assert out.usage.completion_tokens == 1024 - n
    assert out.choices[0].finish_reason == "length"


def test_stop_string_ends_the_text_before_it(oai):
    whole = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, **GREEDY)
    text = whole.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    cut = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, stop=stop,
                                 temperature=0.0)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(stop)]


def test_seed_makes_sampling_reproducible(oai):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, top_p=0.95,
              extra_body={"top_k": 50})
    a = oai.completions.create(seed=7, **kw).choices[0].text
    b = oai.completions.create(seed=7, **kw).choices[0].text
    assert a == b


# ----------------------------------------------------------------------------- errors
def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def post(server, path: str, body: bytes | dict, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, dict):
        return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=30)
    headers["Content-Type"] = "application/json"
    return httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=30)


BAD_REQUESTS = [
    # (path, body, status, param, words the message must hold)
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 4', 400, None, ["not valid JSON"]),
    ("/v1/completions", b'["x"]', 400, None, ["must be a JSON object"]),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt", ["prompt is required"]),
    ("/v1/completions", {"prompt": "x", "max_tokens": "4"}, 400, "max_tokens",
     ["max_tokens", "integer", "'4'"]),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature",
     ["temperature", "number"]),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream", ["stream", "boolean"]),
    ("/v1/completions", {"prompt": 5}, 400, "prompt", ["string or a list of token ids"]),
    ("/v1/completions", {"prompt": "x", "stop": 3}, 400, "stop", ["string or a list"]),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", ["prompt is empty"]),
    ("/v1/completions", {"prompt": []}, 400, "prompt", ["prompt is empty"]),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", ["one prompt per request"]),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt", ["outside the vocabulary"]),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, 400, "max_tokens",
     ["maximum context length is 1024", "at most 1023", "got 5000"]),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", [">= 1"]),
    ("/v1/completions", {"prompt": "x " * 1100}, 400, "prompt", ["at most 1023 tokens"]),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n", ["n must be 1"]),
    ("/v1/completions", {"prompt": "x", "logprobs": 2}, 400, "logprobs", ["not supported"]),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature",
     ["temperature must be >= 0"]),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p", ["top_p must be in (0, 1]"]),
    ("/v1/completions", {"prompt": "x", "top_k": 0}, 400, "top_k", ["-1 (off) or an integer"]),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model",
     ["'gpt-4' does not exist", SERVED]),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", ["at least 1"]),
    ("/v1/chat/completions", {"messages": [{"role": "bob", "content": "x"}]}, 400,
     "messages.0.role", ["'user'"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "messages.0.content", ["text parts"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 3}, 400, "n",
     ["n must be 1"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 2000}, 400, "max_completion_tokens",
     ["max_completion_tokens may be at most"]),
]


@pytest.mark.parametrize("path,body,status,param,words", BAD_REQUESTS,
                         ids=[f"{i}-{p}" for i, (_, _, _, p, _) in enumerate(BAD_REQUESTS)])
def test_bad_request_gets_its_status_and_message(server, path, body, status, param, words):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["param"] == param
    for w in words:
        assert w in err["message"], (w, err["message"])


def test_the_openai_client_raises_its_own_errors(oai):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024"):
        oai.completions.create(model=MODEL, prompt="x", max_tokens=4096)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        oai.completions.create(model=MODEL, prompt="x", n=2)
    # ...and the engine serves on.
    assert oai.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens


def test_api_key_is_required_on_v1_only(server):
    for key in (None, "wrong-key"):
        r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2}, key=key)
        assert r.status_code == 401, r.text
        assert "API key" in error_of(r)["message"]
        assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{server.url}/v1/models", timeout=30).status_code == 401
    assert post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0).models.list()
    # Health checks and scrapers need no key (as with vLLM).
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 200


def test_unknown_route_is_a_404_in_the_error_shape(server):
    r = httpx.get(f"{server.url}/v1/nothing", headers={"Authorization": f"Bearer {API_KEY}"},
                  timeout=30)
    assert r.status_code == 404 and error_of(r)["message"]


def test_server_binds_loopback_only(server):
    assert server.url.startswith("http://127.0.0.1:")
