"""Playground page: type prompts, watch tokens stream back, read each request's figures.

Owns the chat history of one browser tab (session state), the sampling parameter widgets and
the per-request figures measured here (time to first token, tokens/s). Two modes: chat,
when the model folder has a chat template (an optional system prompt and the whole history
sent as messages, rendered by ui.chat as transformers would), and plain completion (each
prompt a separate request the model continues), with a switch. Several tabs may stream at
once: each tab's script thread reads its own request while the engine batches them all. A
prompt the engine rejects shows the engine's message; leaving the page while a reply
streams aborts that request. The engine ends a reply at the model's EOS (its generation
config) and at the stop strings given here.

It must never call st.* from a thread other than the script's, and never import torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2
import streamlit as st

from ui.chat import ChatTemplate, load_chat_template
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
    chat: bool = False  # sent as a chat turn (the reply is drawn as markdown)


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
        ignore_eos = st.toggle("Ignore end-of-sequence", False, key="play.ignore_eos",
                               help="Go on past the model's end-of-sequence token(s).")
        stop_text = st.text_input("Stop strings (comma-separated)", "", key="play.stop",
                                  help="The reply ends before the first of these.")
    params: dict[str, Any] = {
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "top_k": int(top_k),
        "top_p": float(top_p),
        "ignore_eos": bool(ignore_eos),
    }
    stop = [s for s in (part.strip() for part in stop_text.split(",")) if s]
    if stop:
        params["stop"] = stop
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


def draw_reply(box: Any, text: str, chat: bool) -> None:
    """A chat reply as markdown (models answer in it); a completion verbatim."""
    if chat:
        box.markdown(text)
    else:
        box.code(text, language=None, wrap_lines=True)


def stream_reply(
    client: EngineClient, prompt: str, params: dict[str, Any], shown: str, chat: bool
) -> Reply | None:
    """Submit `prompt` (the templated conversation in chat mode), stream the text into an
    assistant message, return the finished reply (`shown` is what the user typed)."""
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
                        draw_reply(box, text, chat)
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
        draw_reply(box, out.text, chat)
        if out.finish_reason == "error":
            st.error(f"The request failed: {out.error or 'the engine stopped'}")
        line = figures_line(t_submit, t_first, t_end, len(out.token_ids), out.finish_reason)
        st.caption(line)
        return Reply(prompt=shown, text=out.text, figures=line, chat=chat)


def chat_controls(template: ChatTemplate | None) -> tuple[bool, str]:
    """The mode switch and the system prompt (in the sidebar): (chat on, system prompt)."""
    with st.sidebar:
        st.subheader("Mode")
        chat = st.toggle(
            "Chat (the model's chat template)",
            value=template is not None,
            key="play.chat",
            disabled=template is None,
            help="On: the conversation goes to the model as messages through its chat "
            "template. Off: each prompt is plain text the model continues."
            if template is not None
            else "This model has no chat template: prompts are plain text it continues.",
        )
        chat = bool(chat) and template is not None
        system = st.text_area(
            "System prompt (optional)",
            "",
            key="play.system",
            disabled=not chat,
            help="Blank: none (the template may put in its own default).",
        )
    return chat, system.strip()


def conversation(history: list[Reply], prompt: str, system: str) -> list[dict[str, str]]:
    """The messages of a chat turn: the system prompt, the earlier chat turns, the prompt."""
    messages = [{"role": "system", "content": system}] if system else []
    for reply in history:
        if reply.chat:
            messages.append({"role": "user", "content": reply.prompt})
            messages.append({"role": "assistant", "content": reply.text})
    messages.append({"role": "user", "content": prompt})
    return messages


def main() -> None:
    client = engine_client()
    show_flashes()
    st.title("Playground")
    model = ""
    with engine_errors(client, "Reading the engine's settings"):
        settings = client.settings()
        model = str(settings.get("model", ""))
        st.markdown(mode_summary(settings))
    template = load_chat_template(model) if model else None
    chat, system = chat_controls(template)
    params = sampling_params()
    history: list[Reply] = st.session_state.setdefault(HISTORY_KEY, [])
    if history and st.sidebar.button("Clear the conversation", key="play.clear"):
        history.clear()
    if chat:
        turns = sum(reply.chat for reply in history)
        st.caption(
            "Chat: your message goes to the model through its chat template, after the "
            f"system prompt (if any) and the {turns} earlier turn{'s' if turns != 1 else ''} "
            "of this conversation. Open more tabs to run several conversations at once."
        )
    else:
        st.caption(
            "Each prompt is a separate request (no chat template): the model continues the "
            "text. Open more tabs to run several prompts at once."
        )
    for reply in history:
        with st.chat_message("user"):
            st.text(reply.prompt)
        with st.chat_message("assistant"):
            draw_reply(st, reply.text, reply.chat)
            st.caption(reply.figures)
    prompt = st.chat_input(
        "Type a prompt and press Enter",
        key="play.prompt",
        disabled=bool(st.session_state.get(INVALID_KEY)),
    )
    if prompt is None:
        return
    with st.chat_message("user"):
        st.text(prompt)
    text = prompt
    if chat and template is not None:
        try:
            text = template.render(conversation(history, prompt, system))
        except (ValueError, jinja2.TemplateError) as exc:
            st.error(f"The model's chat template refused the conversation: {exc}")
            return
    reply = stream_reply(client, text, params, prompt, chat)
    if reply is not None:
        history.append(reply)


main()
