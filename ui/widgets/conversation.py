"""A Playground conversation: each reply from submit to its end, and how the tab draws it.

Owns the ``Reply`` record a tab keeps (the text so far, the settings it was made with, its
figures, why it was cut short), reading a request's deltas while noticing silence
(``follow``), and putting the engine's own account on a reply (``finish``, ``settle``),
whatever ends it: the model, the Stop button, a page left mid-stream, or an engine that died
or hangs. A reply is put in the tab's history before its first token, so a stream cut by
anything (a rerun raises inside the script) leaves its partial text there, marked as cut.
When the engine dies mid-reply the client ends the request with an empty ``token_ids``, so
``reply_tokens`` counts the token events the telemetry bus mirrored before the death.

Owns the checks of what a turn is sent with (``sampling_error`` runs
engine.config.SamplingParams' own validate(), the code the engine runs on submit, so a widget
never accepts what the engine would reject; ``parse_seed`` reads the seed box), and the
drawing of the tab's history (HISTORY_KEY): each prompt, its reply (a chat reply as markdown,
a completion verbatim) and the notes under it. The Playground page draws its conversation
with it, and so does a dead engine's message (ui.engine_link.engine_client's
``kept_when_dead``): a reply cut by the engine's death stays in view beside the restart
button.

It never calls the engine while drawing (the page settles replies first), and never calls
st.* off the script thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import streamlit as st

from engine.config import SamplingParams
from telemetry.records import RequestEvent

POLL_S = 0.25  # how often a wait for the next delta looks up (a hang shows within ~2 s)


@dataclass(slots=True)
class Reply:
    """A request as its tab shows it: the prompt typed, the reply's text so far and how it
    ended. ``state``: "streaming" (tokens still arriving), "done" (the engine ended it),
    "cut" (the tab stopped reading first: Stop, a rerun, the page left)."""

    prompt: str
    settings: str  # the sampling settings it was made with (settings_line)
    chat: bool = False  # sent as a chat turn (the reply is drawn as markdown)
    request_id: str | None = None
    text: str = ""
    figures: str = ""
    state: str = "streaming"
    cut: str | None = None  # why it ended before the model ended it, shown with it
    t_submit: float = 0.0
    t_first: float | None = None
    t_end: float | None = None  # when the tab stopped reading (a cut reply)


def settings_line(params: dict[str, Any]) -> str:
    """What a reply was made with: "greedy · max 64 tokens · seed 7" or "temperature 0.8 ·
    top-p 0.9 · top-k 50 · max 64 tokens · random seed" (only the knobs that act)."""
    parts = []
    if float(params.get("temperature", 1.0)) == 0.0:
        parts.append("greedy")
    else:
        parts.append(f"temperature {float(params['temperature']):g}")
        if float(params.get("top_p", 1.0)) < 1.0:
            parts.append(f"top-p {float(params['top_p']):g}")
        if int(params.get("top_k", -1)) > 0:
            parts.append(f"top-k {int(params['top_k'])}")
    parts.append(f"max {int(params.get('max_tokens', 0))} tokens")
    if params.get("temperature", 1.0) != 0.0:
        parts.append(f"seed {params['seed']}" if params.get("seed") is not None
                     else "random seed")
    if params.get("ignore_eos"):
        parts.append("past EOS")
    if params.get("stop"):
        parts.append("stop at " + ", ".join(repr(s) for s in params["stop"]))
    return " · ".join(parts)


def figures_line(
    t_submit: float, t_first: float | None, t_end: float, tokens: int, finish: str | None,
    prompt_tokens: int | None = None, cached_tokens: int | None = None,
) -> str:
    """ "TTFT 120 ms · 45.1 tokens/s · 64 tokens · e2e 1,520 ms · finished: length ·
    prompt 23 tokens, 16 cached" from wall-clock times and the engine's result.

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
    if prompt_tokens:
        # The prefix cache's share only when the engine said it (None: not known here).
        parts.append(f"prompt {prompt_tokens} tokens" + (
            f", {cached_tokens} cached" if cached_tokens is not None else ""))
    return " · ".join(parts)


def follow(client: Any, reply: Reply, draw: Callable[[str], None],
           waiting: Callable[[float], None], poll_s: float = POLL_S) -> None:
    """Read ``reply.request_id``'s deltas into ``reply.text`` until the request ends (for any
    reason: the model, an abort, the engine's death). ``draw(text)`` after new text;
    ``waiting(silent_s)`` every ``poll_s`` without any, so the page can say the engine hangs
    (and is interrupted there, as in draw, when the user clicks something)."""
    assert reply.request_id is not None
    last = time.monotonic()
    while True:
        try:
            for delta in client.stream(reply.request_id, timeout=poll_s):
                if reply.state != "streaming":  # settled by a newer run of the page
                    return
                now = time.perf_counter()
                reply.t_first = now if reply.t_first is None else reply.t_first
                reply.text += delta
                last = time.monotonic()
                draw(reply.text)
            return
        except TimeoutError:  # EngineNotResponding too: keep waiting, it may resume
            waiting(time.monotonic() - last)


def finish(reply: Reply, out: Any, t_end: float) -> None:
    """The engine's end of ``reply``'s request: its text (ours when the engine's is shorter:
    a dead engine cannot send the rest), figures, and why it was cut if it was."""
    reply.state = "done"
    if len(out.text) >= len(reply.text):
        reply.text = out.text
    # A request the engine's death ended was ended by the client: the engine never said
    # how much of its prompt was cached (the output's 0 is a default, not a figure).
    cached = None if out.finish_reason == "error" else getattr(out, "num_cached_tokens", None)
    reply.figures = figures_line(reply.t_submit, reply.t_first, t_end, len(out.token_ids),
                                 out.finish_reason, len(out.prompt_token_ids) or None, cached)
    if out.finish_reason == "error":
        reply.cut = f"cut short: {getattr(out, 'error', None) or 'the engine stopped'}"
    elif out.finish_reason == "abort" and reply.cut is None:
        reply.cut = "stopped: the engine aborted it"


def interrupt(client: Any, reply: Reply, why: str) -> None:
    """The tab stopped reading ``reply`` mid-stream: abort its request (the engine frees its
    slot and KV blocks at its next step) and keep the text so far, marked as cut (unless a
    reason is there already, or the engine's end was read meanwhile). Idempotent: the
    stream loop's way out and a newer run of the page may both call it, in either order."""
    if reply.state == "streaming":
        reply.state = "cut"
        reply.t_end = time.perf_counter()
    if reply.state == "cut" and reply.cut is None:
        reply.cut = why
    if reply.request_id is not None:
        try:
            client.abort(reply.request_id)
        except Exception:  # aborting a request of a dead engine is moot
            pass


def settle(client: Any, reply: Reply, timeout_s: float = 0.5,
           why: str = "stopped before its end") -> None:
    """For a cut reply, the engine's own account once it has ended the request (after the
    abort): its token count and finish reason. Left as it is while the engine has not
    answered within ``timeout_s`` (asked again on the next run) or knows nothing of it.

    A reply still "streaming" here belongs to an older run of the page that a click
    interrupted: Streamlit starts the new run at once, while the old run's stream loop has
    yet to reach its way out. It is cut (``why``) and aborted from here."""
    if reply.request_id is None or reply.state == "done":
        return
    if reply.state == "streaming":
        interrupt(client, reply, why)
    try:
        out = client.result(reply.request_id, timeout=timeout_s)
    except Exception:  # a timeout, a dead or restarted engine: keep what the tab saw
        return
    why = reply.cut
    finish(reply, out, reply.t_end or time.perf_counter())
    if out.finish_reason != "error":
        reply.cut = why
    reply.state = "done"


def tokens_emitted(events: Iterable[RequestEvent], request_id: str) -> int:
    """Tokens the engine reported emitting for ``request_id`` (its token events)."""
    return sum(
        e.num_tokens
        for e in events
        if e.request_id == request_id and e.kind in ("first_token", "tokens")
    )


def reply_tokens(token_ids: list[int], events: Iterable[RequestEvent], request_id: str) -> int:
    """The reply's token count: the result's own, or what telemetry saw when it is short."""
    return max(len(token_ids), tokens_emitted(events, request_id))


def sampling_error(params: dict[str, Any]) -> str | None:
    """The engine's message for ``params`` (SamplingParams keys), or None when valid."""
    try:
        SamplingParams.coerce(dict(params)).validate()
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def parse_seed(text: str) -> tuple[int | None, str | None]:
    """``(seed, error)`` from the seed box: blank is no seed; otherwise a whole number >= 0."""
    text = text.strip()
    if not text:
        return None, None
    try:
        seed = int(text)
    except ValueError:
        return None, f"seed must be a whole number >= 0 (or blank for none), got {text!r}"
    error = sampling_error({"seed": seed})
    return (None, error) if error else (seed, None)


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
