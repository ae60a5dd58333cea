"""The prefill tax figure says what it measures, and says why in place of what it cannot show
(no fit yet: too few steps; no prefill in the window); the Live page draws it from the engine's
last steps."""

from __future__ import annotations

import json
from pathlib import Path

from fake_engine import FakeEngineClient
from streamlit.testing.v1 import AppTest

from telemetry.bus import TelemetryBus
from telemetry.prefill_tax import prefill_tax
from telemetry.records import Span, StepRecord
from ui.figures.prefill_tax import fit_caption, headline, prefill_tax_figure


def run(chunks: list[tuple[int, int] | None], streams: int = 8) -> list[StepRecord]:
    """Consecutive sync steps of ``streams`` decodes, each with its prefill chunk (tokens, end)
    or none, taking 2 ms + 40 us per prefill token (+ a little, by step number)."""
    t, out = 10**9, []
    for i, chunk in enumerate(chunks):
        parts = [(f"s{j}", 1, 100 + i) for j in range(streams)]
        p = 0
        if chunk is not None:
            parts.append(("long", *chunk))
            p = chunk[0]
        dur = 2_000_000 + 40_000 * p + 1_000 * (i % 7)
        out.append(StepRecord(step=i, mode="sync", slot=0, num_requests=len(parts),
                              prefill_tokens=p, decode_tokens=streams, chunks=parts,
                              spans=[Span("cpu.schedule", t, t + dur // 10),
                                     Span("compute", t + dur // 10, t + dur)]))
        t += dur
    return out


def eight_streams_and_a_long_prompt() -> list[StepRecord]:
    chunks: list[tuple[int, int] | None] = [None] * 60
    for start, size in ((10, 64), (30, 200), (45, 256)):
        for k in range(4):
            chunks[start + k] = (size - 8 * k, (k + 1) * size)
    return run(chunks)


def texts(fig) -> str:
    return " ".join(a.text for a in fig.layout.annotations)


def test_a_window_with_prefill_draws_the_fit_its_band_and_the_tax():
    recs = eight_streams_and_a_long_prompt()
    tax = prefill_tax(recs)
    fig = prefill_tax_figure(tax, recs)
    names = {t.name for t in fig.data}
    assert {"fit", "95% band", "decode-only", "mixed", "p50", "p99"} <= names
    assert {"decode time", "prefill time", "idle time"} <= names
    assert headline(tax).startswith("**Each 1,000 prefill tokens add")
    assert "decode tokens did not vary" in fit_caption(tax)


def test_no_prefill_in_the_window_is_said_on_the_figure():
    recs = run([None] * 30)
    tax = prefill_tax(recs)
    fig = prefill_tax_figure(tax, recs)
    assert "fit" not in {t.name for t in fig.data}
    assert "cannot be fitted" in texts(fig) and "cannot be measured" in headline(tax)
    assert "carried a prefill chunk" in texts(fig)


def test_too_few_steps_say_there_is_no_fit_yet():
    recs = run([(30, 30)] * 4)
    tax = prefill_tax(recs)
    assert headline(tax).startswith("**No fit yet**") and "needs 8" in headline(tax)
    assert "No fit" in texts(prefill_tax_figure(tax, recs))


def test_the_live_page_draws_the_prefill_tax_of_the_last_steps(fake: FakeEngineClient) -> None:
    """The Live page's section fits the steps the engine published: the headline in words and
    the figure in place (a live_plot keyed live.prefill_tax)."""
    fake.bus = TelemetryBus()  # these steps alone, not the stand-in's own decode steps
    for rec in eight_streams_and_a_long_prompt():
        fake.bus.publish_step(rec)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"),
                           default_timeout=30).run()
    assert not at.exception, at.exception
    assert any(m.value.startswith("**Each 1,000 prefill tokens add") for m in at.markdown)
    keys = [json.loads(el.proto.json_args)["key"] for el in at.get("component_instance")]
    assert "live.prefill_tax" in keys
