"""The Diff page's figures (ui/figures/run_diff.py) on the shipped recordings: each batch's
boxes carry the median change and its 95% interval under them, one panel per step kind,
a log axis with readable ticks only when step times span decades, the waterfall in ms per
step (in % of a step across machines), kernel families in their shared colours, the
tables' rows; and the page that draws them (ui/pages/diff.py, without an engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from telemetry.kernel_family import colour_of
from telemetry.records import Span, StepRecord
from telemetry.run_diff import Run, diff_runs, recording_facts
from ui.figures.recordings import RECORDINGS_DIR, load_recording
from ui.figures.run_diff import (
    UNSPLIT_LABEL,
    facet_rows,
    family_figure,
    family_note,
    group_rows,
    interval_text,
    log_ticks,
    step_time_figure,
    waterfall_figure,
)


def serial(times_ms: list[float]) -> list[StepRecord]:
    """Decode-only steps at batch 8, one after another, step k taking times_ms[k]."""
    out, t = [], 0
    for k, ms in enumerate(times_ms):
        end = t + int(ms * 1e6)
        out.append(StepRecord(step=k, mode="sync", slot=0, num_requests=8, prefill_tokens=0,
                              decode_tokens=8, spans=[Span("compute", t, end)]))
        t = end
    return out


def run(name: str, window: str, label: str | None = None) -> Run:
    rec = load_recording(RECORDINGS_DIR / name)
    return Run(label or window, rec.by_mode()[window], recording_facts(rec.meta))


@pytest.fixture(scope="module")
def h200():
    return diff_runs(run("h200-llama-1b.jsonl", "sync+graphs"),
                     run("h200-llama-1b.jsonl", "async+graphs"))


@pytest.fixture(scope="module")
def cpus():
    return diff_runs(run("cpu-tiny.jsonl", "async", "cpu-tiny async"),
                     run("cpu-tiny2.jsonl", "async", "cpu-tiny2 async"))


def test_each_batch_names_its_median_change_and_interval_under_its_boxes(h200) -> None:
    fig = step_time_figure(h200)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["decode-only steps", "steps with a prefill chunk"]
    ticks = dict(zip(fig.layout.xaxis.tickvals, fig.layout.xaxis.ticktext, strict=True))
    (g32,) = [g for g in h200.groups if g.kind == "decode-only" and g.batch == "32"]
    assert ticks["32"] == f"batch 32<br>{interval_text(g32.verdict.change)}"
    assert ticks["32"].startswith("batch 32<br>\u2212")  # async's median step is shorter
    assert ticks["1"] == "batch 1<br>too few"
    boxes = [t for t in fig.data if t.type == "box"]
    assert [b.name for b in boxes] == ["A: sync+graphs", "B: async+graphs"] * 2
    assert sum(len(b.y) for b in boxes) == sum(g.a_ms.size + g.b_ms.size for g in h200.groups)


def test_step_times_across_decades_get_a_log_axis_with_1_2_5_ticks(cpus, h200) -> None:
    fig = step_time_figure(cpus)  # about 200 ms against about 4 ms a step
    assert [a.text for a in fig.layout.annotations] == ["decode-only steps"]
    assert fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis.ticktext[:3] == ("0.2", "0.5", "1")
    assert log_ticks(0.45, 14) == [0.2, 0.5, 1, 2, 5, 10, 20]
    close = diff_runs(Run("A", serial([2.0, 2.1] * 10)), Run("B", serial([2.4, 2.5] * 10)))
    assert step_time_figure(close).layout.yaxis.type != "log"


def test_the_waterfall_is_ms_per_step_and_in_shares_across_machines(h200, cpus) -> None:
    fig = waterfall_figure(h200)
    assert "ms per step" in fig.layout.title.text
    total = {0: 0.0, 1: 0.0}
    for t in fig.data:
        for i, v in enumerate(t.x):
            total[i] += v
    for i, w in enumerate(h200.waterfalls):
        assert w is not None and total[i] == pytest.approx(w.step_ms)
    assert UNSPLIT_LABEL in {t.name for t in fig.data}  # no kernel samples to split it
    fig = waterfall_figure(cpus)  # about 65x apart: each bar in % of its own step
    assert "% of a step" in fig.layout.title.text
    sums = [sum(t.x[i] for t in fig.data) for i in (0, 1)]
    assert sums == pytest.approx([100, 100])


def test_kernel_families_are_drawn_only_where_both_runs_carry_samples(h200) -> None:
    assert family_figure(h200) is None
    assert "no kernel samples in either run" in family_note(h200)
    sampled = diff_runs(run("h200-smollm2-135m.jsonl", "sync+graphs"),
                        run("h200-smollm2-135m.jsonl", "async+graphs"))
    if any(f is None for f in sampled.families):
        pytest.skip("a window of this recording holds no kernel sample")
    fig = family_figure(sampled)
    assert fig is not None and family_note(sampled) == ""
    bars = {t.name: t for t in fig.data}
    assert bars["gemm"].marker.color == colour_of("gemm")
    assert "marker" not in bars


def test_the_tables_say_which_groups_and_facts_the_runs_share(h200) -> None:
    rows = {(r["kind"], r["batch"]): r for r in group_rows(h200.groups)}
    r32 = rows[("decode-only", "32")]
    assert r32["A steps"] == r32["B steps"] == 251 and r32["verdict"] == "faster"
    assert r32["95% interval"].count("%") == 2
    assert rows[("decode-only", "1")]["verdict"] == "too few"
    facts = {r[""]: r for r in facet_rows(h200)}
    assert facts["device"]["same"] == "yes" and facts["mode"]["same"] == "no"
    mixed = diff_runs(run("h200-llama-1b.jsonl", "async+graphs"),
                      run("cpu-tiny2.jsonl", "async"))
    assert {r["verdict"] for r in group_rows(mixed.groups)} == {"one run only"}
    assert {r[""]: r["same"] for r in facet_rows(mixed)}["device"] == "no"


PAGE = str(Path(__file__).resolve().parents[2] / "ui" / "pages" / "diff.py")


def test_the_page_opens_on_the_h200_windows_and_refuses_a_window_against_itself() -> None:
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    assert [s.value for s in at.selectbox] == ["h200-llama-1b.jsonl", "sync+graphs",
                                               "h200-llama-1b.jsonl", "async+graphs"]
    assert at.success[0].value.startswith("**Decode throughput: async+graphs is")
    assert [c.value for c in at.caption if c.value.startswith("Differs")] == [
        "Differs: mode: sync vs async. The figures below show its effect."]
    at.selectbox(key="diff.B.window.h200-llama-1b.jsonl").set_value("sync+graphs").run()
    assert [i.value for i in at.info] == [
        "A and B are the same window: pick another window or run for one side."]
    at.selectbox(key="diff.B.source").set_value("cpu-tiny2.jsonl").run()
    assert at.warning[0].value.startswith(
        "**Not comparable: device: NVIDIA H200 vs CPU (x86_64)")
    assert not at.success  # across devices the verdict is information, not a finding
    assert "h200-llama-1b sync+graphs" in at.info[0].value  # runs named by their source
