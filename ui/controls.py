"""Widgets that act on the running engine: batching mode, slots, CUDA graphs, load generator.

Owns the rule that the engine is the source of truth: before each widget is drawn its
session-state value is set from ``client.settings()``, its key names the engine's settings
version, and a change is a compare-and-set on that version sent from the widget's
``on_change``. So every tab shows what the engine really does, whichever tab changed it, and
a tab that has not yet redrawn can never push its stale value back.

It must never keep its own copy of a setting between runs, and never call the engine from
anywhere but the script thread (callbacks run there too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from ui.client import in_callback

if TYPE_CHECKING:
    from engine.process.client import EngineClient

ASYNC_KEY = "ctl.async"
SLOTS_KEY = "ctl.slots"
GRAPHS_KEY = "ctl.graphs"
SENTINEL_KEY = "ctl.sentinel"
SENTINEL_EVERY = 64  # the toggle's sampling: re-score 1 in 64 finished greedy requests
REFUSED_KEY = "ctl.refused"  # why this tab's last change was not applied (shown once)
SLOT_CHOICES = (1, 2, 3)


def mode_summary(settings: dict[str, Any]) -> str:
    """One line saying what the engine runs now, e.g. "mode async · 2 slots · graphs off"."""
    mode = "async" if settings.get("async_batching") else "sync"
    slots = settings.get("num_slots")
    graphs = "on" if settings.get("cuda_graphs") else "off"
    return (
        f"mode **{mode}** · {slots} slot{'s' if slots != 1 else ''} · CUDA graphs {graphs} · "
        f"{settings.get('device', '?')} · `{settings.get('model', '?')}` "
        f"({settings.get('dtype', '?')}) · forward {settings.get('model_impl', '?')}"
        f"{' (torch.compile)' if settings.get('torch_compile') else ''}"
        + (f" · settings v{settings['settings_version']}" if "settings_version" in settings
           else "")
    )


def widget_key(base: str, settings: dict[str, Any]) -> str:
    """The key of a settings widget drawn from ``settings``: it names the engine process and
    its settings version, so each new state of the engine is a new widget. A browser that
    still holds a widget of an older state (a tab not yet redrawn) can only send it under
    the old key, whose change carries the old version and is refused by the engine."""
    return f"{base}.{settings.get('engine_pid', 0)}.{settings.get('settings_version', 0)}"


def _push(client: EngineClient, what: str, version: int | None, key: str,
          **change: Any) -> None:
    from ui.status import REMEMBERED
    from ui.tab import tab_id

    def call() -> None:
        # A compare-and-set on the version this tab showed: the engine applies the change
        # once, and refuses it if anything (another tab, the API) changed the settings since.
        after = client.configure(**change, expect_version=version, origin=tab_id())
        REMEMBERED.remember(after)  # the engine's answer is the new truth at once
        if after.get("refused"):  # said under the toggles (a callback draws nothing)
            st.session_state[REFUSED_KEY] = f"{what}: not applied; {after['refused']}."

    try:
        in_callback(what, call)
    finally:
        # Whatever came of it (applied, refused, failed), the widget shows the engine's
        # value: a callback may set a widget's state, the script body never does.
        field, _ = next(iter(change.items()))
        latest = REMEMBERED.latest()
        if field in latest:
            value = latest[field]
            if field == "cuda_graphs":
                value = bool(value) and bool(latest.get("cuda_graphs_available"))
            elif field == "sentinel_sample_every":
                value = bool(value)
            st.session_state[key] = value


def engine_controls(client: EngineClient, settings: dict[str, Any]) -> None:
    """Async on/off, slots 1/2/3 and CUDA graphs on/off, in three columns. Each widget shows
    the engine's value and is keyed by the engine's settings version (widget_key)."""
    version = settings.get("settings_version")
    keys = {base: widget_key(base, settings)
            for base in (ASYNC_KEY, SLOTS_KEY, GRAPHS_KEY, SENTINEL_KEY)}
    available = bool(settings.get("cuda_graphs_available"))
    # A new widget (a new engine state) starts at the engine's value. Its state is never
    # set again from the script body: doing that on every run made Streamlit fire on_change
    # for values nobody clicked (seen in the server log as refused stale changes).
    for base, value in ((ASYNC_KEY, bool(settings["async_batching"])),
                        (SLOTS_KEY, int(settings["num_slots"])),
                        (GRAPHS_KEY, bool(settings.get("cuda_graphs")) and available),
                        (SENTINEL_KEY, bool(settings.get("sentinel_sample_every")))):
        if keys[base] not in st.session_state:
            st.session_state[keys[base]] = value

    def on_change(base: str, what: str, field: str) -> None:
        _push(client, what, version, keys[base], **{field: st.session_state[keys[base]]})

    # Widths for the labels: "Async batching" and "CUDA graphs" were cut at 1280 in equal
    # quarters of the row ("Async batch...", "CUDA gra...").
    async_col, slots_col, graphs_col, sentinel_col = st.columns([1.45, 1, 1.3, 1.35])
    with async_col:
        st.toggle(
            "Async batching",
            key=keys[ASYNC_KEY],
            help="Build batch N+1 on the CPU while the device runs batch N.",
            on_change=on_change,
            args=(ASYNC_KEY, "Switching async batching", "async_batching"),
        )
    with slots_col:
        st.segmented_control(
            "Slots",
            SLOT_CHOICES,
            key=keys[SLOTS_KEY],
            required=True,
            help="Sets of input/output buffers the steps take turns with.",
            on_change=on_change,
            args=(SLOTS_KEY, "Changing the slot count", "num_slots"),
        )
    with graphs_col:
        reason = settings.get("cuda_graphs_reason") or "CUDA graphs are not available here."
        st.toggle(
            "CUDA graphs",
            key=keys[GRAPHS_KEY],
            disabled=not available,
            help=(
                "Replay captured graphs of forward + sampling per token-count bucket."
                if available
                else reason
            ),
            on_change=on_change,
            args=(GRAPHS_KEY, "Switching CUDA graphs", "cuda_graphs"),
        )
        if not available:
            st.caption(reason)
    with sentinel_col:
        sentinel_control(client, settings, version, keys[SENTINEL_KEY])
    refused = st.session_state.pop(REFUSED_KEY, None)
    if refused:
        st.caption(f":material/sync_problem: {refused}")


def sentinel_line(stats: dict[str, Any]) -> str:
    """The sentinel's running result, e.g. "checked 120 · mismatches 0 (0.0%)"."""
    checked = int(stats.get("sentinel_checked", 0))
    bad = int(stats.get("sentinel_mismatches", 0))
    rate = f" ({100 * bad / checked:.1f}%)" if checked else ""
    return f"checked {checked:,} · mismatches {bad:,}{rate}"


def sentinel_control(client: EngineClient, settings: dict[str, Any], version: int | None,
                     key: str) -> None:
    """The async-correctness sentinel on/off (1 in SENTINEL_EVERY finished greedy requests
    re-scored through the synchronous path), and its running mismatch count."""
    every = int(settings.get("sentinel_sample_every") or 0)

    def on_change() -> None:
        _push(client, "Switching the sentinel", version, key,
              sentinel_sample_every=SENTINEL_EVERY if st.session_state[key] else 0)

    st.toggle(
        "Async sentinel",
        key=key,
        on_change=on_change,
        help=f"Re-score 1 in {SENTINEL_EVERY} finished greedy requests through the synchronous "
             "path on this engine and compare tokens: a live check that async output is right "
             "(gapless:sentinel_* on /metrics).",
    )
    if every:
        st.caption(f"1 in {every} · " + sentinel_line(client.stats()))


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
    line = " · ".join(parts)
    if stats.get("stopped_reason"):
        line += f" · stopped: {stats['stopped_reason']}"
    return line


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
    or their defaults), and its counts in one line."""
    stats = client.load_stats()
    from ui.status import REMEMBERED

    REMEMBERED.remember_load(stats)  # a restart starts it again with this spec
    running = bool(stats.get("running"))
    spec = load_spec_from_state()
    error = load_lengths_error(spec.prompt_len, spec.max_tokens, settings.get("max_model_len"))
    if running:
        st.button(
            "Stop load",
            key="load.stop",
            icon=":material/stop:",
            on_click=lambda: in_callback("Stopping the load generator", client.stop_load),
        )
    else:
        what = (f"{spec.concurrency} concurrent" if spec.concurrency is not None
                else f"{spec.rate:g} req/s")
        st.button(
            "Start load",
            key="load.start",
            type="primary",
            icon=":material/play_arrow:",
            disabled=error is not None,
            help=f"{what}, {spec.prompt_len} prompt + {spec.max_tokens} output tokens "
                 "(set under Load generator, below)." + (f" {error}" if error else ""),
            on_click=lambda: in_callback(
                "Starting the load generator",
                lambda: client.start_load(load_spec_from_state()),
            ),
        )
    st.caption(("running · " if running else "stopped · ") + load_stats_line(stats))
