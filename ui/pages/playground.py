"""Playground page: type prompts, watch tokens stream back, read each request's figures.

Owns the chat history of one browser tab (session state), the sampling parameter widgets and
the per-request figures measured here (time to first token, tokens/s). Two modes: chat,
when the model folder has a chat template (an optional system prompt and the whole history
sent as messages, rendered by ui.widgets.chat_prompt as transformers would), and plain
completion (each prompt a separate request the model continues), with a switch. What a
person types goes to the engine as token ids in which it is plain text
(ui.widgets.chat_prompt): a typed control token never acts as one. Several tabs may stream
at once: each tab's script thread reads its own request while the engine batches them all.

A reply streams under a Stop button; Stop (or leaving the page, or any click that reruns it)
aborts the request in the engine and keeps the text so far, marked as cut. While a reply
waits on an engine that hangs, the page says so within about two seconds (the banner's
fragment cannot run during a stream); an engine that dies mid-reply leaves the partial reply
marked as cut, and in view beside the dead engine's restart message (ui.widgets.conversation).
Each reply shows the settings it was made with (ui.widgets.conversation).

It must never call st.* from a thread other than the script's, and never import torch.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import jinja2
import streamlit as st

from ui.engine_link import (
    current_settings,
    engine_client,
    engine_errors,
    engine_status,
    show_not_responding,
)
from ui.widgets.chat_prompt import (
    ChatTemplate,
    PromptTokenizer,
    load_chat_template,
    load_prompt_tokenizer,
)
from ui.widgets.conversation import (
    HISTORY_KEY,
    Reply,
    draw_notes,
    draw_prompt,
    draw_reply,
    draw_turn,
    finish,
    follow,
    interrupt,
    parse_seed,
    sampling_error,
    settings_line,
    settle,
    show_conversation,
)
from ui.widgets.fragments import run_page

if TYPE_CHECKING:
    from engine.process.client import EngineClient

INVALID_KEY = "play.invalid"
STREAM_REDRAW_S = 0.05  # redraw a streaming reply at most 20 times a second
INTERRUPTED = "stopped before its end (the page was left or rerun)"
STOPPED = "stopped (Stop button)"
SETTLE_S = 2.0  # how long a run waits for the engine to end a stopped request (one step)
EMPTY_PROMPT = "Nothing was sent: the prompt is empty or only spaces. Type some text."


def sampling_params() -> dict[str, Any]:
    """The sampling widgets (in the sidebar), as a dict for SamplingParams. Greedy by
    default: the small default model answers facts right greedily and wrongly at 0.8."""
    with st.sidebar:
        st.subheader("Sampling")
        max_tokens = st.slider("Max new tokens", 1, 512, 64, key="play.max_tokens")
        temperature = st.slider(
            "Temperature",
            0.0,
            2.0,
            0.0,
            step=0.05,
            key="play.temperature",
            help="0 means greedy (the most likely token every time): the default, and what "
            "a small model answers facts best with. Higher values sample.",
        )
        # No bounds of its own: a bounded box keeps its last valid value when a value out
        # of bounds is typed (5000 went on saying "got 0"); the engine's rule speaks instead.
        top_k = st.number_input("Top-k", value=-1, step=1, key="play.top_k",
                                help="Sample among the k most likely tokens only; -1: off.")
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
    # The engine's own rules (a negative seed...): refuse here, not after submit. Computed
    # from this run's values only, so a message never outlives the value it was about.
    st.session_state[INVALID_KEY] = seed_error or sampling_error(params)
    if st.session_state[INVALID_KEY]:
        st.sidebar.error(st.session_state[INVALID_KEY])
    return params


def _stop_clicked(client: EngineClient) -> None:
    """Stop's callback: abort the streaming reply's request and say why it is cut. The
    click also reruns the page, and the run streaming it stops on its way (it may still be
    running now: Streamlit starts the new run first)."""
    for reply in reversed(st.session_state.get(HISTORY_KEY, [])):
        if reply.state == "streaming" or reply.cut == INTERRUPTED:
            reply.cut = STOPPED
            interrupt(client, reply, STOPPED)
            break


def _clear() -> None:
    st.session_state[HISTORY_KEY] = []


class HangNotice:
    """The not-responding message in a placeholder next to a streaming reply: drawn when
    the engine stops answering, removed when it answers again."""

    def __init__(self, client: EngineClient, box: Any) -> None:
        self.client, self.box, self.shown, self.count = client, box, False, 0

    def __call__(self, silent_s: float) -> None:
        st.session_state.get(HISTORY_KEY)  # a yield point: a click (Stop) interrupts here
        status = engine_status(self.client)
        if status.state == "not_responding" and not self.shown:
            self.count += 1  # a fresh key each time: a key may be drawn once a run
            with self.box.container():
                show_not_responding(self.client, status.reason,
                                    key=f"play.kill_restart.{self.count}")
            self.shown = True
        elif status.state != "not_responding":
            self.answered()

    def answered(self) -> None:
        """The engine sent something: the notice goes."""
        if self.shown:
            self.box.empty()
            self.shown = False


def stream_reply(client: EngineClient, reply: Reply, history: list[Reply]) -> None:
    """Stream ``reply``'s request into an assistant message under a Stop button; however
    the stream ends, the reply stays in ``history`` with what arrived."""
    history.append(reply)
    with st.chat_message("assistant"):
        stop_box = st.empty()
        stop_box.button("Stop", key="play.stop_reply", icon=":material/stop_circle:",
                        on_click=_stop_clicked, args=(client,),
                        help="Abort this request in the engine; the text so far stays, "
                        "marked as cut.")
        trouble = st.empty()
        box = st.empty()
        drawn = [0.0]
        hang = HangNotice(client, trouble)

        def draw(text: str) -> None:
            hang.answered()
            now = time.perf_counter()
            if now - drawn[0] >= STREAM_REDRAW_S:  # a redraw per token floods the socket
                draw_reply(box, text, reply.chat)
                drawn[0] = now

        done = False
        try:
            follow(client, reply, draw, hang)
            done = True
        finally:
            if not done:  # Stop, a rerun, the page left, a dead engine: free the engine's slot
                interrupt(client, reply, INTERRUPTED if client.alive()
                          else f"cut short: {client.death_reason() or 'the engine stopped'}")
        stop_box.empty()
        trouble.empty()
        reply.state = "cut"  # until the result is read: a later run settles it otherwise
        with engine_errors(client, "Reading the result") as read:
            out = client.result(reply.request_id, timeout=5.0)
        if not read.failed:
            finish(reply, out, time.perf_counter())
        draw_reply(box, reply.text, reply.chat)
        draw_notes(reply)


def chat_controls(template: ChatTemplate | None) -> tuple[bool, str]:
    """The mode switch, the system prompt and Clear (in the sidebar): (chat on, system)."""
    with st.sidebar:
        st.button("Clear the conversation", key="play.clear", on_click=_clear,
                  icon=":material/delete_sweep:", help="Forget this tab's prompts and replies.")
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
    """The messages of a chat turn: the system prompt, the earlier chat turns (a cut reply
    as far as it went), the prompt."""
    messages = [{"role": "system", "content": system}] if system else []
    for reply in history:
        if reply.chat:
            messages.append({"role": "user", "content": reply.prompt})
            messages.append({"role": "assistant", "content": reply.text})
    messages.append({"role": "user", "content": prompt})
    return messages


def prompt_for_engine(prompt: str, history: list[Reply], system: str,
                      template: ChatTemplate | None, tok: PromptTokenizer | None
                      ) -> str | list[int]:
    """What goes to the engine: token ids in which the typed text is plain (ValueError or a
    jinja2 error when the chat template refuses); the text itself without a tokenizer."""
    if template is not None:
        messages = conversation(history, prompt, system)
        if tok is None:
            return template.render(messages)
        return tok.chat(template, messages).ids
    return prompt if tok is None else tok.plain(prompt).ids


def main() -> None:
    # A dead engine stops the page at its restart message: the conversation stays under it.
    client = engine_client(kept_when_dead=show_conversation)
    st.title("Playground")  # the engine's mode line is the banner's, above
    model = ""
    with engine_errors(client, "Reading the engine's settings"):
        model = str(current_settings(client).get("model", ""))
    template = load_chat_template(model) if model else None
    tok = load_prompt_tokenizer(model) if model else None
    chat, system = chat_controls(template)
    params = sampling_params()
    history: list[Reply] = st.session_state.setdefault(HISTORY_KEY, [])
    note = st.empty()  # rewritten once a reply of this run has joined the conversation
    if chat:
        note.caption(chat_note(history))
    else:
        st.caption(
            "Each prompt is a separate request (no chat template): the model continues the "
            "text. Open more tabs to run several prompts at once."
        )
    if tok is None:
        st.caption("No tokenizer.json in the model folder: prompts go as text, and the "
                   "engine's tokenizer reads control tokens typed in them.")
    alive = engine_status(client).state == "alive"
    for reply in history:
        if alive:  # a stopped reply: the engine's own end, once it has one
            settle(client, reply, timeout_s=SETTLE_S, why=INTERRUPTED)
        draw_turn(reply)
    prompt = st.chat_input(
        "Type a prompt and press Enter",
        key="play.prompt",
        disabled=bool(st.session_state.get(INVALID_KEY)),
    )
    if prompt is None:
        return
    if not prompt.strip():
        st.warning(EMPTY_PROMPT)
        return
    with st.chat_message("user"):
        draw_prompt(prompt)
    try:
        sent = prompt_for_engine(prompt, history, system, template if chat else None, tok)
    except (ValueError, jinja2.TemplateError) as exc:
        st.error(f"The model's chat template refused the conversation: {exc}")
        return
    with engine_errors(client, "The engine rejected the prompt") as submitted:
        t_submit = time.perf_counter()
        rid = client.submit(sent, params)
    if submitted.failed:
        return
    reply = Reply(prompt=prompt, settings=settings_line(params), chat=chat, request_id=rid,
                  t_submit=t_submit)
    try:
        stream_reply(client, reply, history)
    finally:
        if chat:  # the turn just made counts for the next message
            note.caption(chat_note(history))


def chat_note(history: list[Reply]) -> str:
    """What the next message goes to the model with: the system prompt and the earlier
    chat turns of this conversation, counted now."""
    turns = sum(reply.chat for reply in history)
    return ("Chat: your message goes to the model through its chat template, after the "
            f"system prompt (if any) and the {turns} earlier turn{'s' if turns != 1 else ''} "
            "of this conversation. Open more tabs to run several conversations at once.")


run_page(main)
