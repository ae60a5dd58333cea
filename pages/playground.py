"""Playground page: type prompts, watch tokens stream back, read each request's figures.

Owns the chat history of one browser tab (session state), the sampling parameter widgets and
the per-request figures measured here (time to first token, tokens/s). Several tabs may
stream at once: each tab's script thread reads its own request while the engine batches
them all. A prompt the engine rejects shows the engine's message; leaving the page while a
reply streams aborts that request.

It must never call st.* from a thread other than the script's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import streamlit as st

from ui.client import engine_client, engine_errors, show_flashes
from ui.controls import mode_summary
from ui.validation import parse_seed, sampling_error

if TYPE_CHECKING:
    from engine.process.client import EngineClient

HISTORY_KEY = "play.history"
INVALID_KEY = "play.invalid"
STREAM_REDRAW_S = 0.05  # redraw a streaming reply at most 20 times a second


@dataclass(slots=True)
class Reply:
    """One finished (or stopped) request as the tab shows it."""

    prompt: str
    text: str
    figures: str


def sampling_params() -> dict[str, Any]:
    """The sampling widgets (in the sidebar), as a dict for SamplingParams."""
    with st.sidebar:
        st.subheader("Sampling")
        max_tokens = st.slider("Max new tokens", 1, 512, 64, key="play.max_tokens")
        temperature = st.slider(
            "Temperature",
            0.0,
            2.0,
            0.8,
            step=0.05,
            key="play.temperature",
            help="0 means greedy (the most likely token every time).",
        )
        top_k = st.number_input(
            "Top-k",
            min_value=-1,
            max_value=1000,
            value=-1,
            key="play.top_k",
            help="-1 disables top-k.",
        )
        top_p = st.slider("Top-p", 0.05, 1.0, 1.0, step=0.05, key="play.top_p")
        seed_text = st.text_input("Seed (blank: random)", "", key="play.seed")
        ignore_eos = st.toggle("Ignore end-of-sequence", False, key="play.ignore_eos")
    params: dict[str, Any] = {
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "top_k": int(top_k),
        "top_p": float(top_p),
        "ignore_eos": bool(ignore_eos),
    }
    seed, seed_error = parse_seed(seed_text)
    if seed is not None:
        params["seed"] = seed
    # The engine's own rules (top-k 0, a negative seed...): refuse here, not after submit.
    st.session_state[INVALID_KEY] = seed_error or sampling_error(params)
    if st.session_state[INVALID_KEY]:
        st.sidebar.error(st.session_state[INVALID_KEY])
    return params


def figures_line(
    t_submit: float, t_first: float | None, t_end: float, tokens: int, finish: str | None
) -> str:
    """ "TTFT 120 ms · 45.1 tokens/s · 64 tokens · finished: length" from wall-clock times.

    tokens/s counts the tokens after the first over the time after the first (the decode
    rate a reader sees); with a single token it is tokens over end-to-end time.
    """
    parts = []
    if t_first is not None:
        parts.append(f"TTFT {1000 * (t_first - t_submit):,.0f} ms")
    if t_first is not None and tokens > 1 and t_end > t_first:
        parts.append(f"{(tokens - 1) / (t_end - t_first):,.1f} tokens/s")
    elif tokens and t_end > t_submit:
        parts.append(f"{tokens / (t_end - t_submit):,.1f} tokens/s")
    parts.append(f"{tokens} token{'s' if tokens != 1 else ''}")
    parts.append(f"e2e {1000 * (t_end - t_submit):,.0f} ms")
    if finish:
        parts.append(f"finished: {finish}")
    return " · ".join(parts)


def stream_reply(client: EngineClient, prompt: str, params: dict[str, Any]) -> Reply | None:
    """Submit, stream the text into an assistant message, return the finished reply."""
    with engine_errors(client, "The engine rejected the prompt") as submitted:
        t_submit = time.perf_counter()
        rid = client.submit(prompt, params)
    if submitted.failed:
        return None
    with st.chat_message("assistant"):
        box = st.empty()
        text, t_first, done = "", None, False
        try:
            with engine_errors(client, "Streaming the reply"):
                t_drawn = 0.0
                for delta in client.stream(rid):
                    now = time.perf_counter()
                    t_first = now if t_first is None else t_first
                    text += delta
                    if now - t_drawn >= STREAM_REDRAW_S:  # a redraw per token floods the socket
                        box.code(text, language=None, wrap_lines=True)
                        t_drawn = now
                done = True
        finally:
            if not done:  # the page was left or rerun mid-stream: free the engine's slot
                try:
                    client.abort(rid)
                except Exception:  # aborting a request of a dead engine is moot
                    pass
        if not done:
            return None
        with engine_errors(client, "Reading the result") as read:
            out = client.result(rid)
        if read.failed:
            return None
        t_end = time.perf_counter()
        box.code(out.text, language=None, wrap_lines=True)
        if out.finish_reason == "error":
            st.error(f"The request failed: {out.error or 'the engine stopped'}")
        line = figures_line(t_submit, t_first, t_end, len(out.token_ids), out.finish_reason)
        st.caption(line)
        return Reply(prompt=prompt, text=out.text, figures=line)


def main() -> None:
    client = engine_client()
    show_flashes()
    st.title("Playground")
    with engine_errors(client, "Reading the engine's settings"):
        st.markdown(mode_summary(client.settings()))
    params = sampling_params()
    history: list[Reply] = st.session_state.setdefault(HISTORY_KEY, [])
    if history and st.sidebar.button("Clear the conversation", key="play.clear"):
        history.clear()
    for reply in history:
        with st.chat_message("user"):
            st.text(reply.prompt)
        with st.chat_message("assistant"):
            st.code(reply.text, language=None, wrap_lines=True)
            st.caption(reply.figures)
    st.caption(
        "Each prompt is a separate request (no chat template): the model continues the "
        "text. Open more tabs to run several prompts at once."
    )
    prompt = st.chat_input(
        "Type a prompt and press Enter",
        key="play.prompt",
        disabled=bool(st.session_state.get(INVALID_KEY)),
    )
    if prompt is None:
        return
    with st.chat_message("user"):
        st.text(prompt)
    reply = stream_reply(client, prompt, params)
    if reply is not None:
        history.append(reply)


main()
