"""Benchmark page: one fixed workload, the modes alternated over N repetitions, compared
honestly (telemetry.verdict: a 95% interval over the alternated pairs of runs decides).

Owns the run settings (repetitions), the progress display (runs, requests finished, tokens
generated) and the results: per mode the median total time and tokens/s with their spread,
a verdict against the first mode, each run's time as a dot, and the A/B view of the median
runs' timelines. The workload runs inside the engine process (EngineClient.run_benchmark,
driven from a background thread by ui/widgets/bench_runner.py so every tab sees it running); this
page only starts it and shows what comes back.

It must never run the benchmark while the load generator is on (the figures would measure
both), and never change the engine's live settings behind the user's back (run_benchmark
puts them back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import streamlit as st

from telemetry.verdict import runs_verdict, spread
from ui.engine_link import engine_client, engine_errors
from ui.figures.ab import Window
from ui.widgets.ab_view import show_ab
from ui.widgets.bench_runner import RUNS, BenchmarkRun, alternated, base_label
from ui.widgets.fragments import live_fragment, run_page
from ui.widgets.tab import tab_id

if TYPE_CHECKING:
    from engine.process.client import EngineClient

REPS_KEY = "bench.repetitions"
# The fixed workload: small enough to finish in well under a minute per run on a CPU.
NUM_REQUESTS = 16
PROMPT_LEN = 64
MAX_TOKENS = 64
DEFAULT_REPETITIONS = 3
PROGRESS_PERIOD_S = 0.5
CONTROLS_PERIOD_S = 1.0


def benchmark_modes(graphs_available: bool) -> list[Any]:
    from engine.drivers.workload import default_modes

    return default_modes(cuda_graphs=graphs_available)


def benchmark_spec(settings: dict[str, Any], repetitions: int) -> Any:
    """The fixed workload, every mode this machine can run, alternated ``repetitions`` times."""
    from engine.drivers.workload import BenchmarkSpec

    graphs = bool(settings.get("cuda_graphs_available"))
    return BenchmarkSpec(
        num_requests=NUM_REQUESTS,
        prompt_len=PROMPT_LEN,
        max_tokens=MAX_TOKENS,
        modes=alternated(benchmark_modes(graphs), repetitions),
    )


def grouped(results: list[Any]) -> dict[str, list[Any]]:
    """Results by mode ("async #2" -> "async"), modes in first-run order."""
    out: dict[str, list[Any]] = {}
    for r in results:
        out.setdefault(base_label(r.mode_label), []).append(r)
    return out


def _predicted(runs: list) -> float | None:
    values = [r.predicted_async_s for r in runs if getattr(r, "predicted_async_s", None)]
    return round(spread(values).median, 3) if values else None


def results_table(results: list[Any]) -> list[dict[str, Any]]:
    """One row per mode: median and spread (lowest-highest) of its runs."""
    rows = []
    for mode, runs in grouped(results).items():
        t = spread([r.total_s for r in runs])
        tps = spread([r.tokens_per_s for r in runs])
        busy = spread([100 * r.gpu_busy for r in runs])
        rows.append({
            "mode": mode,
            "runs": t.n,
            "total s (median)": round(t.median, 3),
            "total s (spread)": f"{t.lo:.3f}-{t.hi:.3f}",
            "tokens/s (median)": round(tps.median, 1),
            "tokens/s (spread)": f"{tps.lo:,.0f}-{tps.hi:,.0f}",
            "step busy % (median)": round(busy.median, 1),  # first kernel to last, per step
            "idle s (median)": round(spread([r.idle_total_s for r in runs]).median, 3),
            # From sync runs: their time less what async would save (telemetry.predict).
            "predicted async s (median)": _predicted(runs),
        })
    return rows


TABLE_COLUMNS = {
    "total s (median)": st.column_config.NumberColumn(format="%.3f"),
    "tokens/s (median)": st.column_config.NumberColumn(format="%.1f"),
    "step busy % (median)": st.column_config.NumberColumn(
        format="%.1f", help="Per step, first kernel to last: the compute lane's busy share."),
    "idle s (median)": st.column_config.NumberColumn(format="%.3f"),
    "predicted async s (median)": st.column_config.NumberColumn(
        format="%.3f", help="From the sync runs: their time less what async would save."),
}


def verdicts(results: list[Any]) -> list[tuple[bool, str]]:
    """Each mode against the first, on total time (lower is better)."""
    groups = grouped(results)
    names = list(groups)
    if len(names) < 2:
        return []
    base = names[0]
    a = [r.total_s for r in groups[base]]
    out = []
    for name in names[1:]:
        v = runs_verdict(a, [r.total_s for r in groups[name]], a_label=base, b_label=name,
                         what="total time", unit=" s", fmt=".3f", higher_is_better=False)
        out.append((v.measurable, v.text))
    return out


def runs_figure(results: list[Any]) -> go.Figure:
    """Every run's total time as a dot per mode, the median as a bar: the spread at a glance."""
    fig = go.Figure()
    for mode, runs in grouped(results).items():
        times = [r.total_s for r in runs]
        fig.add_trace(go.Bar(x=[mode], y=[spread(times).median], name=mode, opacity=0.35,
                             showlegend=False, hovertemplate="median %{y:.3f} s<extra></extra>"))
        fig.add_trace(go.Scatter(x=[mode] * len(runs), y=times, mode="markers",
                                 marker={"size": 10, "color": "#333"}, showlegend=False,
                                 text=[r.mode_label for r in runs],
                                 hovertemplate="%{text}: %{y:.3f} s<extra></extra>"))
    fig.update_layout(height=260, margin={"l": 40, "r": 10, "t": 30, "b": 30},
                      title={"text": "total time per run (dots) and median (bar)",
                             "font": {"size": 13}},
                      yaxis={"title": {"text": "s"}, "rangemode": "tozero"})
    return fig


def median_run(runs: list[Any]) -> Any:
    ordered = sorted(runs, key=lambda r: r.total_s)
    return ordered[(len(ordered) - 1) // 2]


def show_results(results: list[Any]) -> None:
    st.subheader("Results")
    for measurable, text in verdicts(results):
        (st.success if measurable else st.info)(text)
    # The table has the page's width: in three fifths of it the last column was cut to
    # "predicte..." even at 1600 px.
    # "–" where a figure does not apply (the async prediction of an async run).
    st.dataframe(results_table(results), hide_index=True, key="bench.table",
                 column_config=TABLE_COLUMNS, placeholder="–")
    left, _ = st.columns([1, 1])
    with left:
        st.plotly_chart(runs_figure(results), key="bench.runs", config={"displaylogo": False})
    digests = {r.tokens_digest for r in results if getattr(r, "tokens_digest", 0)}
    if len(digests) == 1:
        st.caption("Every run produced the same greedy tokens (equal digests).")
    groups = grouped(results)
    if len(groups) >= 2:
        st.subheader("Timelines of the median runs")
        names = list(groups)
        a, b = median_run(groups[names[0]]), median_run(groups[names[1]])
        # Drawn: the median runs; judged: every alternated run of each mode (decode-only
        # steps, a t-interval over the pairs from three repetitions up).
        show_ab(Window(names[0], a.records, runs=[r.records for r in groups[names[0]]]),
                Window(names[1], b.records, runs=[r.records for r in groups[names[1]]]),
                key="bench.ab")


def progress_view(run: BenchmarkRun) -> None:
    """Progress of the running benchmark (a fragment every PROGRESS_PERIOD_S)."""
    if not run.running:
        st.rerun()  # the full run draws the results
    run.poll_tokens()
    with run.lock:
        p = run.progress
        label, phase, done, total = p.label, p.phase, p.done, p.total
        index, runs, tokens, expected = p.run_index, p.runs, p.tokens, p.tokens_expected
    frac = min(1.0, tokens / expected) if expected else 0.0
    st.progress(
        frac,
        text=f"run {min(index + 1, runs)} of {runs} ({label or 'starting'}, {phase}): "
        f"{done}/{total} requests finished · {tokens:,} of {expected:,} tokens generated",
    )
    st.button("Stop the benchmark", key="bench.stop", on_click=run.cancel,
              icon=":material/stop:")


def run_controls(client: EngineClient, settings: dict[str, Any], running: bool) -> None:
    """The Run button and its repetitions, with the load generator's state read now; when
    a benchmark started or ended since the page was drawn, the whole page is redrawn."""
    load_on = True  # until the engine says otherwise
    with engine_errors(client, "Reading the load generator"):
        load_on = client.load_running()
    now_running = RUNS.running() is not None
    if now_running != running:
        st.rerun()  # the progress (or the results) replace what the page drew
    if load_on:
        st.warning("The load generator is running: stop it on the Live page first.")
    cols = st.columns([1, 3], vertical_alignment="bottom")
    with cols[0]:
        st.number_input("Repetitions per mode", min_value=1, max_value=10,
                        value=DEFAULT_REPETITIONS, key=REPS_KEY, disabled=running)
    with cols[1]:
        st.button("Run the benchmark", key="bench.run", type="primary",
                  disabled=load_on or running, icon=":material/play_arrow:",
                  on_click=start, args=(client, settings))


def start(client: EngineClient, settings: dict[str, Any]) -> None:
    reps = int(st.session_state.get(REPS_KEY, DEFAULT_REPETITIONS))
    try:
        RUNS.start(client, benchmark_spec(settings, reps), who=tab_id())
    except ValueError as exc:
        st.session_state["bench.start_error"] = str(exc)


def main() -> None:
    client = engine_client()
    st.title("Benchmark")
    with engine_errors(client, "Reading the engine's settings"):
        settings = client.settings()
    graphs = bool(settings.get("cuda_graphs_available"))
    st.markdown(
        f"One fixed workload, **{NUM_REQUESTS} requests x ({PROMPT_LEN} prompt + {MAX_TOKENS} "
        f"new tokens)**, greedy with no early stop, on an otherwise idle engine: sync and "
        f"async{', CUDA graphs off and on' if graphs else ''}, taken in turn (sync, async, "
        "sync, async...) so that a slow moment of the machine falls on every mode alike. "
        "Each mode's figures are the median of its runs with their spread; a difference "
        "inside the spreads is not called a difference (and is called no difference only "
        "when the medians are within 2%)."
    )
    if not graphs:
        st.caption(
            f"CUDA graph modes are left out: {settings.get('cuda_graphs_reason') or 'no GPU here'}."
        )
    run = RUNS.current
    running = run is not None and run.running
    # Re-read every second: the load stopped (or a benchmark started) from another tab
    # enables (or disables) Run here without a reload.
    live_fragment(run_controls, CONTROLS_PERIOD_S)(client, settings, running)
    failed = st.session_state.pop("bench.start_error", None)
    if failed:
        st.error(f"The benchmark could not start: {failed}")
    if run is None:
        return
    if running:
        live_fragment(progress_view, PROGRESS_PERIOD_S)(run)
        return
    with run.lock:
        results, error, cancelled = list(run.results), run.error, run.cancelled
    if error:
        st.error(f"The benchmark failed: {error}")
    elif cancelled:
        st.warning("The benchmark was stopped; the runs that finished are below.")
    if results:
        show_results(results)


run_page(main)
