"""Widgets that act on the running engine: batching mode, slots, CUDA graphs, the token
budget, load generator.

Owns the rule that the engine is the source of truth. Each settings widget is drawn with the
engine's value as its default and a key that names the engine process and its settings
version (``widget_key``), so every new state of the engine is a new widget, and a browser
that still holds a widget of an older state can only send its value under the old key. A
change is a compare-and-set on the version the widget was drawn at, sent from the widget's
``on_change``; a callback whose value is the one its widget was drawn with is no change by
the user (a widget the browser drew anew reports its default) and sends nothing. The
widgets' state is never written, from the script or a callback: a widget whose change was
not applied is drawn anew under a new key, at the engine's value.

While a benchmark holds the engine (it switches the settings itself and the engine refuses
other changes) the controls and the load switch are drawn disabled, saying why. What went
wrong with a change is said beside its control in the run that follows the click (the
controls live in fragments: a message kept for the page's next full run would show late,
on another page, and pile up).

It must never keep its own copy of a setting between runs, and never call the engine from
anywhere but the script thread (callbacks run there too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import streamlit as st

from engine.config import NUM_SLOTS
from ui.engine_link import in_callback

if TYPE_CHECKING:
    from engine.process.client import EngineClient

ASYNC_KEY = "ctl.async"
SLOTS_KEY = "ctl.slots"
GRAPHS_KEY = "ctl.graphs"
SENTINEL_KEY = "ctl.sentinel"
BUDGET_KEY = "ctl.budget"
BUDGET_SAID_KEY = "ctl.budget_said"  # what came of this tab's last budget change
SENTINEL_EVERY = 64  # the toggle's sampling: re-score 1 in 64 finished greedy requests
SAID_KEY = "ctl.said"  # what came of this tab's last change, said once under the controls
REDRAW_KEY = "ctl.redraw"  # bumped when a change was not applied: the widgets drawn anew
SENT_KEY = "ctl.sent"  # (widget key, value) of the last change sent: each click sends once
LOAD_SAID_KEY = "load.said"  # what went wrong with this tab's last start or stop of the load
BENCHMARK_HOLDS = ("A benchmark holds the engine: it switches the settings itself and "
                   "they come back when it ends.")


def mode_summary(settings: dict[str, Any]) -> str:
    """One line saying what the engine runs now, e.g. "mode async · 2 slots · CUDA graphs
    off · budget 512 tokens"."""
    mode = "async" if settings.get("async_batching") else "sync"
    slots = settings.get("num_slots")
    graphs = "on" if settings.get("cuda_graphs") else "off"
    budget = settings.get("max_num_batched_tokens")
    return (
        f"mode **{mode}** · {slots} slot{'s' if slots != 1 else ''} · CUDA graphs {graphs} · "
        + (f"budget {budget} tokens · " if budget is not None else "") +
        f"{settings.get('device', '?')} · `{settings.get('model', '?')}` "
        f"({settings.get('dtype', '?')}) · forward {settings.get('model_impl', '?')}"
        f"{' (torch.compile)' if settings.get('torch_compile') else ''}"
        + (f" · settings v{settings['settings_version']}" if "settings_version" in settings
           else "")
    )


def benchmark_holds(settings: dict[str, Any]) -> bool:
    """A benchmark runs on the engine: this dashboard's own or one another client started."""
    from ui.widgets.bench_runner import RUNS

    return bool(settings.get("benchmark_running")) or RUNS.running() is not None


def widget_key(base: str, settings: dict[str, Any], redraw: int = 0) -> str:
    """The key of a settings widget drawn from ``settings``: it names the engine process and
    its settings version (last), so each new state of the engine is a new widget, and
    ``redraw`` (this tab's count of changes not applied), so a widget whose change was
    refused is drawn anew at the engine's value."""
    return (f"{base}.{settings.get('engine_pid', 0)}.{redraw}."
            f"{settings.get('settings_version', 0)}")


def _say(key: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        st.session_state[key] = message

    return say


def _push(client: EngineClient, what: str, version: int | None, said_key: str = SAID_KEY,
          **change: Any) -> None:
    """Send one change as a compare-and-set on ``version``; say what came of it when it was
    not applied (under ``said_key``, read where the widget is), and have the widgets drawn
    anew (at the engine's values) then."""
    from ui.engine_link import REMEMBERED
    from ui.widgets.tab import tab_id

    answer: dict[str, Any] = {}

    def call() -> None:
        # The engine applies the change once, and refuses it if anything (another tab, the
        # API) changed the settings since the version this tab showed.
        answer.update(client.configure(**change, expect_version=version, origin=tab_id()))
        REMEMBERED.remember(answer)  # the engine's answer is the new truth at once

    failed = in_callback(what, call)
    field, wanted = next(iter(change.items()))
    if failed is None and answer.get("refused") and answer.get(field) != wanted:
        failed = f"{what}: not applied; {answer['refused']}."
    if failed is not None:
        st.session_state[said_key] = failed
        st.session_state[REDRAW_KEY] = int(st.session_state.get(REDRAW_KEY, 0)) + 1


def engine_controls(client: EngineClient, settings: dict[str, Any]) -> None:
    """Async on/off, slots 1/2/3, CUDA graphs on/off and the sentinel, in four columns. Each
    widget shows the engine's value and is keyed by the engine's settings version."""
    version = settings.get("settings_version")
    available = bool(settings.get("cuda_graphs_available"))
    held = benchmark_holds(settings)
    redraw = int(st.session_state.get(REDRAW_KEY, 0))
    drawn = {ASYNC_KEY: bool(settings["async_batching"]),
             SLOTS_KEY: int(settings["num_slots"]),
             GRAPHS_KEY: bool(settings.get("cuda_graphs")) and available,
             SENTINEL_KEY: bool(settings.get("sentinel_sample_every"))}
    keys = {base: widget_key(base, settings, redraw) for base in drawn}

    def on_change(base: str, what: str, field: str) -> None:
        value = st.session_state.get(keys[base])
        if value is None or value == drawn[base]:
            return  # the value the widget was drawn with: nobody changed it
        if st.session_state.get(SENT_KEY) == (keys[base], value):
            return  # this click again: the browser resent it with a later rerun
        st.session_state[SENT_KEY] = (keys[base], value)
        if base == SENTINEL_KEY:
            value = SENTINEL_EVERY if value else 0
        _push(client, what, version, **{field: value})

    def args(base: str, what: str, field: str) -> dict[str, Any]:
        return {"key": keys[base], "on_change": on_change, "args": (base, what, field),
                "disabled": held}

    # Widths for the labels: "Async batching" and "CUDA graphs" were cut at 1280 in equal
    # quarters of the row ("Async batch...", "CUDA gra...").
    async_col, slots_col, graphs_col, sentinel_col = st.columns([1.45, 1, 1.3, 1.35])
    with async_col:
        st.toggle(
            "Async batching",
            value=drawn[ASYNC_KEY],
            help="Build batch N+1 on the CPU while the device runs batch N.",
            **args(ASYNC_KEY, "Switching async batching", "async_batching"),
        )
    with slots_col:
        st.segmented_control(
            "Slots",
            NUM_SLOTS,
            default=drawn[SLOTS_KEY],
            required=True,
            help="Sets of input/output buffers the steps take turns with.",
            **args(SLOTS_KEY, "Changing the slot count", "num_slots"),
        )
    with graphs_col:
        reason = settings.get("cuda_graphs_reason") or "CUDA graphs are not available here."
        graph_args = args(GRAPHS_KEY, "Switching CUDA graphs", "cuda_graphs")
        graph_args["disabled"] = held or not available
        st.toggle(
            "CUDA graphs",
            value=drawn[GRAPHS_KEY],
            help=(
                "Replay captured graphs of forward + sampling per token-count bucket."
                if available
                else reason
            ),
            **graph_args,
        )
        if not available:
            st.caption(reason)
    with sentinel_col:
        st.toggle(
            "Async sentinel",
            value=drawn[SENTINEL_KEY],
            help=f"Re-score 1 in {SENTINEL_EVERY} finished greedy requests through the "
                 "synchronous path on this engine and compare tokens: a live check that async "
                 "output is right (gapless:sentinel_* on /metrics).",
            **args(SENTINEL_KEY, "Switching the sentinel", "sentinel_sample_every"),
        )
        every = int(settings.get("sentinel_sample_every") or 0)
        if every:
            st.caption(f"1 in {every} · " + sentinel_line(client.stats()))
    if held:
        st.caption(f":material/speed: {BENCHMARK_HOLDS}")
    said = st.session_state.pop(SAID_KEY, None)
    if said:
        st.caption(f":material/sync_problem: {said}")


def token_budget_input(client: EngineClient, settings: dict[str, Any]) -> None:
    """The token budget (max_num_batched_tokens) in force, and a number field that changes
    it within the engine's range, as the other settings widgets do: drawn at the engine's
    value, keyed by its settings version, sent as a compare-and-set from on_change."""
    version = settings.get("settings_version")
    low, high = (int(x) for x in settings["max_num_batched_tokens_range"])
    drawn = int(settings["max_num_batched_tokens"])
    key = widget_key(BUDGET_KEY, settings, int(st.session_state.get(REDRAW_KEY, 0)))

    def on_change() -> None:
        value = st.session_state.get(key)
        if value is None or value == drawn:
            return  # the value the widget was drawn with: nobody changed it
        if st.session_state.get(SENT_KEY) == (key, value):
            return  # this change again: the browser resent it with a later rerun
        st.session_state[SENT_KEY] = (key, value)
        _push(client, "Changing the token budget", version, said_key=BUDGET_SAID_KEY,
              max_num_batched_tokens=int(value))

    st.number_input(
        "Token budget (max_num_batched_tokens)",
        min_value=low,
        max_value=high,
        value=drawn,
        step=max(1, low),
        key=key,
        on_change=on_change,
        disabled=benchmark_holds(settings),
        help=f"Tokens one step may carry: running decodes first, then prefill chunks. From "
             f"{low} (max_num_seqs: every running request gets a token each step) to {high} "
             "(what the engine was started with: its buffers and CUDA graph buckets are sized "
             "for it). Smaller cuts prompts into smaller chunks: running requests wait less "
             "between tokens, new ones longer for their first.",
    )
    said = st.session_state.pop(BUDGET_SAID_KEY, None)
    if said:
        st.caption(f":material/sync_problem: {said}")


def sentinel_line(stats: dict[str, Any]) -> str:
    """The sentinel's running result, e.g. "checked 120 · mismatches 0 (0.0%)"."""
    checked = int(stats.get("sentinel_checked", 0))
    bad = int(stats.get("sentinel_mismatches", 0))
    rate = f" ({100 * bad / checked:.1f}%)" if checked else ""
    return f"checked {checked:,} · mismatches {bad:,}{rate}"


LOAD_DRIVE_KEY = "load.drive"
LOAD_CONC_KEY = "load.concurrency"
LOAD_RATE_KEY = "load.rate"
LOAD_PROMPT_KEY = "load.prompt_len"
LOAD_TOKENS_KEY = "load.max_tokens"
DRIVES = ("concurrency", "request rate")
DEFAULT_CONCURRENCY = 8
DEFAULT_RATE = 4.0
DEFAULT_LEN = 64


def load_spec_from_state() -> Any:
    """The LoadSpec the load generator widgets describe."""
    from engine.drivers.loadgen import LoadSpec

    state = st.session_state
    by_rate = state.get(LOAD_DRIVE_KEY) == "request rate"
    return LoadSpec(
        concurrency=None if by_rate else int(state.get(LOAD_CONC_KEY, DEFAULT_CONCURRENCY)),
        rate=float(state.get(LOAD_RATE_KEY, DEFAULT_RATE)) if by_rate else None,
        prompt_len=int(state.get(LOAD_PROMPT_KEY, DEFAULT_LEN)),
        max_tokens=int(state.get(LOAD_TOKENS_KEY, DEFAULT_LEN)),
    )


def load_lengths_error(prompt_len: int, max_tokens: int, max_model_len: int | None) -> str | None:
    """The engine's own rule (engine.drivers.loadgen.LoadGenerator): prompt + output tokens
    must fit in max_model_len. None when they do (or the limit is unknown)."""
    if max_model_len and prompt_len + max_tokens > max_model_len:
        return (
            f"prompt + output = {prompt_len + max_tokens} tokens exceeds the engine's "
            f"max_model_len of {max_model_len}; make the prompt or the output shorter"
        )
    return None


def load_stats_line(stats: dict[str, Any]) -> str:
    """Like "submitted 120 · finished 112 · in flight 8 · dropped 3 · errors 0"."""
    parts = [
        f"submitted {stats.get('submitted', 0):,}",
        f"finished {stats.get('finished', 0):,}",
        *([f"aborted {stats['aborted']:,}"] if "aborted" in stats else []),
        f"in flight {stats.get('inflight', 0):,}",
        f"dropped arrivals {stats.get('dropped', 0):,}",
    ]
    if stats.get("errors"):
        parts.append(f"errors {stats['errors']:,}")
    return " · ".join(parts)


class LoadStops:
    """Who in this dashboard (every tab of the server) last stopped the load generator;
    None once it is started again (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: str | None = None

    def stopped(self, who: str) -> None:
        with self._lock:
            self._by = who

    def started(self) -> None:
        with self._lock:
            self._by = None

    def by(self) -> str | None:
        with self._lock:
            return self._by


LOAD_STOPS = LoadStops()


def stop_load(client: EngineClient, who: str) -> None:
    """Stop the load generator, remembering who asked (the load line says it)."""
    LOAD_STOPS.stopped(who)
    client.stop_load()


def load_state(stats: dict[str, Any], this_tab: str, stopped_by: str | None) -> str:
    """The load generator's state in words: "running", "not started", "stopped by this
    tab", "stopped by tab <id>", "stopped by a client outside this dashboard" (the HTTP
    API, say) or "stopped: <why>" when it ended on its own (the engine shut down)."""
    if stats.get("running"):
        return "running"
    reason = stats.get("stopped_reason")
    if reason is None:
        return "not started" if not stats.get("submitted") else "stopped"
    if reason != "stopped":
        return f"stopped: {reason}"
    if stopped_by is None:
        return "stopped by a client outside this dashboard"
    return "stopped by this tab" if stopped_by == this_tab else f"stopped by {stopped_by}"


def load_generator(client: EngineClient, settings: dict[str, Any]) -> None:
    """The load generator's parameters: concurrency or request rate, prompt and output
    lengths (greyed while it runs). Its start/stop switch is load_switch, in the page's top
    row; both read the same session-state keys."""
    max_num_seqs = int(settings.get("max_num_seqs", 8))
    max_len = settings.get("max_model_len")
    cap = int(max_len) - 1 if max_len else 8192
    running = bool(client.load_stats().get("running"))
    cols = st.columns([1.2, 1, 1, 1])
    with cols[0]:
        drive = st.radio("Drive by", DRIVES, key=LOAD_DRIVE_KEY, disabled=running)
    with cols[1]:
        if drive == "concurrency":
            st.number_input(
                "Concurrent requests",
                min_value=1,
                max_value=max(1, 4 * max_num_seqs),
                value=min(DEFAULT_CONCURRENCY, 4 * max(1, max_num_seqs)),
                key=LOAD_CONC_KEY,
                disabled=running,
            )
        else:
            st.number_input(
                "Requests per second",
                min_value=0.1,
                max_value=1000.0,
                value=DEFAULT_RATE,
                step=0.5,
                key=LOAD_RATE_KEY,
                disabled=running,
                help=f"At most {4 * max_num_seqs} in flight (4 x max_num_seqs): arrivals "
                "beyond that are dropped and counted.",
            )
    with cols[2]:
        st.number_input(
            "Prompt tokens",
            min_value=1,
            value=min(DEFAULT_LEN, max(1, cap)),
            key=LOAD_PROMPT_KEY,
            disabled=running,
            help=f"Prompt + output must fit in max_model_len ({max_len or '?'} tokens).",
        )
    with cols[3]:
        st.number_input(
            "Output tokens",
            min_value=1,
            value=min(DEFAULT_LEN, max(1, cap)),
            key=LOAD_TOKENS_KEY,
            disabled=running,
            help=f"Prompt + output must fit in max_model_len ({max_len or '?'} tokens).",
        )
    spec = load_spec_from_state()
    error = load_lengths_error(spec.prompt_len, spec.max_tokens, max_len)
    if error and not running:
        st.error(error)


def load_switch(client: EngineClient, settings: dict[str, Any]) -> None:
    """Start or stop the load generator (with the parameters of load_generator's widgets,
    or their defaults), and its state and counts in one line. Disabled while a benchmark
    holds the engine (it needs an idle engine and refuses a load); what went wrong with a
    click is said under it at once."""
    from ui.engine_link import REMEMBERED
    from ui.widgets.tab import tab_id

    stats = client.load_stats()
    REMEMBERED.remember_load(stats)  # a restart starts it again with this spec
    running = bool(stats.get("running"))
    held = benchmark_holds(settings)
    spec = load_spec_from_state()
    error = load_lengths_error(spec.prompt_len, spec.max_tokens, settings.get("max_model_len"))
    say = _say(LOAD_SAID_KEY)

    def stop() -> None:
        failed = in_callback("Stopping the load generator", lambda: stop_load(client, tab_id()))
        if failed:
            say(failed)

    def start() -> None:
        def call() -> None:
            client.start_load(load_spec_from_state())
            LOAD_STOPS.started()

        failed = in_callback("Starting the load generator", call)
        if failed:
            say(failed)

    if running:
        st.button("Stop load", key="load.stop", icon=":material/stop:", on_click=stop,
                  disabled=held)
    else:
        what = (f"{spec.concurrency} concurrent" if spec.concurrency is not None
                else f"{spec.rate:g} req/s")
        st.button(
            "Start load",
            key="load.start",
            type="primary",
            icon=":material/play_arrow:",
            disabled=error is not None or held,
            help=(BENCHMARK_HOLDS if held else
                  f"{what}, {spec.prompt_len} prompt + {spec.max_tokens} output tokens "
                  "(set under Load generator, below)." + (f" {error}" if error else "")),
            on_click=start,
        )
    state = load_state(stats, tab_id(), LOAD_STOPS.by())
    st.caption(f"{state} · {load_stats_line(stats)}")
    said = st.session_state.pop(LOAD_SAID_KEY, None)
    if said:
        st.caption(f":material/sync_problem: {said}")
