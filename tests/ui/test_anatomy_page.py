"""The step-anatomy figures from a recording summary, and the page on a stand-in engine:
record on click, the step and family tables, one step's kernel timeline, the trace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st
from fake_engine import FakeEngineClient
from streamlit.testing.v1 import AppTest

import ui.engine_link
from ui.figures.anatomy import family_rows, step_rows, step_timeline_figure

APP = Path(__file__).resolve().parents[2] / "app.py"


def test_timeline_has_a_row_per_family_from_the_first_kernel() -> None:
    summary = FakeEngineClient().record_anatomy(3)
    fig = step_timeline_figure(summary, 101)
    assert {t.name for t in fig.data} == {"gemm", "attention", "norm"}
    starts = sorted(float(b) for t in fig.data for b in t.base)
    assert starts == [0.0, 30.0, 60.0]  # microseconds from the step's first kernel
    assert [r["step"] for r in step_rows(summary)] == [100, 101, 102]
    assert step_rows(summary)[0]["between kernels (us)"] == pytest.approx(10.0)
    assert {r["family"] for r in family_rows(summary)} == {"gemm", "attention", "norm"}
    with pytest.raises(ValueError, match="recorded steps: \\[100, 101, 102\\]"):
        step_timeline_figure(summary, 7)


def stand_in(monkeypatch: pytest.MonkeyPatch, client: FakeEngineClient) -> FakeEngineClient:
    st.cache_resource.clear()
    monkeypatch.setattr(ui.engine_link, "make_client", lambda: client)
    return client


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngineClient]:
    """An engine on a GPU (the stand-in's device is "cuda" when graphs are available)."""
    yield stand_in(monkeypatch, FakeEngineClient(graphs_available=True))
    st.cache_resource.clear()


@pytest.fixture
def cpu_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngineClient]:
    yield stand_in(monkeypatch, FakeEngineClient())
    st.cache_resource.clear()


def test_page_records_on_click_and_shows_tables_and_timeline(fake: FakeEngineClient) -> None:
    at = AppTest.from_file(str(APP), default_timeout=30).run()
    at.switch_page("ui/pages/anatomy.py").run()
    assert not at.exception
    assert len(at.dataframe) == 0  # nothing recorded until asked
    at.number_input(key="anatomy.n").set_value(4).run()
    at.button(key="anatomy.record").click().run()
    assert not at.exception and not at.error
    assert len(at.dataframe) == 2
    assert list(at.dataframe[0].value["step"]) == [100, 101, 102, 103]
    assert at.selectbox(key="anatomy.step").value == 102


def test_on_a_cpu_it_says_there_are_no_kernels_and_shows_the_shipped_h200_anatomy(
    cpu_fake: FakeEngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(cpu_fake, "record_anatomy", lambda *a, **k: asked.append(1))
    at = AppTest.from_file(str(APP), default_timeout=30).run()
    at.switch_page("ui/pages/anatomy.py").run()
    assert not at.exception
    assert any("no GPU kernels" in m.value for m in at.info)
    assert not [b for b in at.button if b.key == "anatomy.record"]  # nothing to record
    assert not asked
    shipped = at.dataframe[0].value  # the shipped H200 results, then its family table
    gapless = shipped[(shipped["implementation"] == "gapless") & (shipped["batch"] == 32)]
    assert list(gapless["kernels/step"]) == [373]  # the shipped 8B step, docs/recordings
    assert any("H200" in c.value and "commit" in c.value for c in at.caption)


def test_on_an_idle_engine_it_asks_for_load_instead_of_waiting(
    fake: FakeEngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(fake, "record_anatomy", lambda *a, **k: asked.append(1))
    monkeypatch.setattr(fake, "stats", lambda: {"running": 0, "waiting": 0, "unfinished": 0})
    at = AppTest.from_file(str(APP), default_timeout=30).run()
    at.switch_page("ui/pages/anatomy.py").run()
    at.button(key="anatomy.record").click().run()
    assert not at.exception and not at.error
    assert not asked  # no recording asked of an engine with nothing to run
    assert any("engine is idle" in w.value for w in at.warning)


def test_a_step_the_profiler_lost_shows_as_not_measured_never_as_idle(
    fake: FakeEngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recording's step 101 lost its kernel records: the step table keeps it, its timings
    empty and "not measured" said, and the page counts it; when every step is lost, the page
    says so instead of showing nothing."""
    from telemetry.anatomy import Kernel, StepKernels, summary_dict

    def recording(lost: set[int]):
        def record(n_steps: int = 8, timeout_s: float = 30.0) -> dict:
            steps = [StepKernels(100 + k, [] if 100 + k in lost else [
                Kernel("nvjet_tst_gemm", "gemm", 1000.0 * k, 25.0),
                Kernel("rms_norm_kernel", "norm", 1000.0 * k + 30, 5.0)]) for k in range(3)]
            return summary_dict(steps, device="cuda", first_step=100)
        return record

    monkeypatch.setattr(fake, "record_anatomy", recording({101}))
    at = AppTest.from_file(str(APP), default_timeout=30).run()
    at.switch_page("ui/pages/anatomy.py").run()
    at.button(key="anatomy.record").click().run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert list(table["step"]) == [100, 101, 102]
    lost = table[table["step"] == 101].iloc[0]
    assert lost["measured"].startswith("not measured")
    assert lost.isna()["between kernels (us)"]  # no gap that would read as idle
    assert any("1 not measured" in h.value for h in at.subheader)
    monkeypatch.setattr(fake, "record_anatomy", recording({100, 101, 102}))
    at.button(key="anatomy.record").click().run()
    assert not at.exception
    assert any("None of the 3 recorded steps was measured" in w.value for w in at.warning)
