"""Benchmark page: one fixed workload in sync and async mode (graphs off/on with a GPU).

Owns the run button, the progress display and the side-by-side results: total time,
tokens/s, GPU busy, idle time, and each mode's timeline. The workload itself runs inside
the engine process (EngineClient.run_benchmark on an otherwise idle engine); this page only
starts it and shows what comes back. Results stay in the tab's session state.

It must never run the benchmark while the load generator is on (the figures would measure
both), and never change the engine's live settings behind the user's back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from ui.client import engine_client, engine_errors, show_flashes
from ui.timeline import timeline_figure

if TYPE_CHECKING:
    from engine.process.client import EngineClient

RESULTS_KEY = "bench.results"
# The fixed workload: small enough to finish in well under a minute on a CPU.
NUM_REQUESTS = 16
PROMPT_LEN = 64
MAX_TOKENS = 64


def benchmark_spec(settings: dict[str, Any]) -> Any:
    """The fixed workload, over every mode this machine can run."""
    from engine.drivers.workload import BenchmarkSpec

    graphs = bool(settings.get("cuda_graphs_available"))
    return BenchmarkSpec(
        num_requests=NUM_REQUESTS,
        prompt_len=PROMPT_LEN,
        max_tokens=MAX_TOKENS,
        modes=benchmark_modes(graphs),
    )


def benchmark_modes(graphs_available: bool) -> list[Any]:
    from engine.drivers.workload import default_modes

    return default_modes(cuda_graphs=graphs_available)


def results_table(results: list[Any]) -> list[dict[str, Any]]:
    """One row per mode, in run order."""
    return [
        {
            "mode": r.mode_label,
            "total s": round(r.total_s, 3),
            "tokens/s": round(r.tokens_per_s, 1),
            "step busy %": round(100 * r.gpu_busy, 1),  # first kernel to last, per step
            "idle s": round(r.idle_total_s, 3),
            "idle gaps": r.idle_gaps,
            # From a sync run: its time less what async would save (telemetry.predict).
            "predicted async s": None if getattr(r, "predicted_async_s", None) is None
            else round(r.predicted_async_s, 3),
        }
        for r in results
    ]


def run(client: EngineClient, settings: dict[str, Any]) -> list[Any] | None:
    """Run the workload with a progress bar; the results, or None when it failed."""
    from engine.drivers.workload import BenchmarkResult

    spec = benchmark_spec(settings)
    bar = st.progress(0.0, text="Starting the benchmark...")
    results: list[Any] = []
    with engine_errors(client, "The benchmark failed") as outcome:
        for item in client.run_benchmark(spec):
            if isinstance(item, BenchmarkResult):  # one mode finished
                results.append(item)
                continue
            frac = item.done / item.total if item.total else 0.0
            bar.progress(
                min(frac, 1.0),
                text=f"{item.mode_label}: {item.done}/{item.total} requests finished",
            )
    bar.empty()
    return None if outcome.failed else results


def show_results(results: list[Any]) -> None:
    st.subheader("Results")
    st.dataframe(results_table(results), hide_index=True, key="bench.table")
    base = results[0]
    cols = st.columns(len(results))
    for col, r in zip(cols, results, strict=True):
        with col:
            change = 100 * (r.total_s / base.total_s - 1) if base.total_s else 0.0
            st.metric(
                r.mode_label,
                f"{r.total_s:.2f} s",
                delta=None if r is base else f"{change:+.1f}% time vs {base.mode_label}",
                delta_color="inverse",  # less time is better
                help="Total time from the first request queued to the last one finished.",
            )
            st.metric("tokens/s", f"{r.tokens_per_s:,.0f}")
            st.metric("step busy", f"{100 * r.gpu_busy:.1f}%",
                      help="Share of the run the GPU was executing a step (first kernel to last).")
            st.metric("idle time", f"{r.idle_total_s * 1000:,.0f} ms ({r.idle_gaps} gaps)")
    st.subheader("Timelines")
    for r in results:
        fig = timeline_figure(r.records, title=f"{r.mode_label}: all {len(r.records)} steps")
        st.plotly_chart(fig, key=f"bench.timeline.{r.mode_label}")


def main() -> None:
    client = engine_client()
    show_flashes()
    st.title("Benchmark")
    with engine_errors(client, "Reading the engine's settings"):
        settings = client.settings()
    graphs = bool(settings.get("cuda_graphs_available"))
    st.markdown(
        f"One fixed workload, **{NUM_REQUESTS} requests x ({PROMPT_LEN} prompt + {MAX_TOKENS} "
        f"new tokens)**, greedy with no early stop, run once per mode on an otherwise idle "
        f"engine: sync and async{', CUDA graphs off and on' if graphs else ''}."
    )
    if not graphs:
        st.caption(
            f"CUDA graph modes are left out: {settings.get('cuda_graphs_reason') or 'no GPU here'}."
        )
    busy = client.load_running()
    if busy:
        st.warning("The load generator is running: stop it on the Live page first.")
    if st.button(
        "Run the benchmark",
        key="bench.run",
        type="primary",
        disabled=busy,
        icon=":material/play_arrow:",
    ):
        results = run(client, settings)
        if results:
            st.session_state[RESULTS_KEY] = results
    results = st.session_state.get(RESULTS_KEY)
    if results:
        show_results(results)


main()
