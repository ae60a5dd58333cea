"""How a Playground tab's conversation is drawn: each prompt, its reply and the notes under it.

Owns the tab's history key in the session state and the drawing of a reply (a chat reply as
markdown, a completion verbatim) with why it was cut, the settings it was made with and its
figures. The Playground page draws its conversation with it, and so does a dead engine's
message (ui/engine_trouble.py, through ui.client.engine_client's ``kept_when_dead``): a reply
cut by the engine's death stays in view beside the restart button, not only after a restart.

It must never call the engine (the page settles replies before drawing them), and never call
st.* off the script thread.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from ui.playground_replies import Reply

HISTORY_KEY = "play.history"
# A prompt longer than this (characters or lines) is drawn in a box of PROMPT_BOX_PX that
# scrolls: a pasted document drawn whole pushed the reply thousands of pixels down.
LONG_PROMPT_CHARS = 1500
LONG_PROMPT_LINES = 20
PROMPT_BOX_PX = 240


def draw_prompt(prompt: str) -> None:
    """What the person typed, verbatim; a long one in a box of its own height that scrolls,
    with its length said under it."""
    lines = prompt.count("\n") + 1
    if len(prompt) <= LONG_PROMPT_CHARS and lines <= LONG_PROMPT_LINES:
        st.text(prompt)
        return
    with st.container(height=PROMPT_BOX_PX):
        st.text(prompt)
    st.caption(f"{len(prompt):,} characters, {lines:,} line{'s' if lines != 1 else ''}: "
               "scroll the box to read it all.")


def draw_reply(box: Any, text: str, chat: bool) -> None:
    """A chat reply as markdown (models answer in it); a completion verbatim."""
    if chat:
        box.markdown(text)
    else:
        box.code(text, language=None, wrap_lines=True)


def draw_notes(reply: Reply) -> None:
    """Under a reply: why it was cut (if it was), the settings it used, its figures."""
    if reply.cut:
        st.warning(f"Partial reply, {reply.cut}.", icon=":material/content_cut:")
    st.caption(f"{reply.settings}" + (f" · {reply.figures}" if reply.figures else ""))


def draw_turn(reply: Reply) -> None:
    with st.chat_message("user"):
        draw_prompt(reply.prompt)
    with st.chat_message("assistant"):
        draw_reply(st, reply.text, reply.chat)
        draw_notes(reply)


def history() -> list[Reply]:
    """This tab's replies, oldest first (kept in the session state)."""
    return st.session_state.setdefault(HISTORY_KEY, [])


def show_conversation() -> None:
    """The tab's conversation as it stands, with nothing asked of the engine: what stays in
    view under a dead engine's restart message."""
    turns = history()
    if not turns:
        return
    st.caption("This tab's conversation, as far as it went:")
    for reply in turns:
        draw_turn(reply)
