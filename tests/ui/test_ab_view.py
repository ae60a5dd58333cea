"""The A/B figure: B's decode-rate bar carries the verdict's 95% interval as an error bar,
the verdict on the shipped recordings names the async gain with that interval, and the tiles'
figures fit their tiles."""

from __future__ import annotations

import re

import pytest

from telemetry.verdict import decode_steps as decode_of
from telemetry.verdict import decode_verdict, pooled
from ui.figures.ab import ab_figure, short_ms, side_header
from ui.figures.recordings import RECORDINGS_DIR, load_recording
from ui.figures.window_stats import window_stats


def figure_of(name: str, a_label: str, b_label: str):
    rec = load_recording(RECORDINGS_DIR / name)
    windows = rec.by_mode()
    a, b = windows[a_label], windows[b_label]
    v = decode_verdict([a], [b], a_label=a_label, b_label=b_label)
    (ta, _), (tb, _) = pooled([decode_of(a)]), pooled([decode_of(b)])
    fig = ab_figure(window_stats(a, a_label), window_stats(b, b_label), (ta, tb),
                    tput=v.throughput)
    bars = [t for t in fig.data if t.xaxis == "x" and t.type == "bar"]
    return v, bars, ta, tb, fig


def test_the_h200_1b_async_bar_carries_the_interval_above_syncs_bar() -> None:
    """The verdict says async is faster with an interval that excludes zero: the error bar
    on async's bar then stays wholly above sync's bar, and spans the interval."""
    v, (a_bar, b_bar), ta, tb, fig = figure_of("h200-llama-1b.jsonl", "sync+graphs",
                                               "async+graphs")
    assert v.measurable and v.throughput is not None
    assert a_bar.error_y.array is None  # the interval is B against A: one error bar, on B
    err = b_bar.error_y
    assert err.type == "data" and err.symmetric is False
    low, high = tb - err.arrayminus[0], tb + err.array[0]
    assert ta < low < tb < high
    t = v.throughput
    assert high / low == pytest.approx((1 + t.hi / 100) / (1 + t.lo / 100), rel=1e-9)
    assert "95% interval" in b_bar.hovertemplate
    assert fig.layout.annotations[0].text == "decode tokens/s · 95% interval"


def test_an_interval_holding_zero_reaches_below_the_other_bar() -> None:
    """The tiny CPU recording: not settled, so the error bar reaches past sync's level."""
    v, (_, b_bar), ta, tb, _ = figure_of("cpu-tiny.jsonl", "sync", "async")
    assert v.throughput is not None and v.throughput.holds_zero()
    err = b_bar.error_y
    assert tb - err.arrayminus[0] <= ta <= tb + err.array[0]


def test_no_interval_no_error_bar() -> None:
    rec = load_recording(RECORDINGS_DIR / "cpu-tiny.jsonl")
    w = rec.by_mode()
    fig = ab_figure(window_stats(w["sync"], "sync"), window_stats(w["async"], "async"),
                    (10.0, 12.0))
    assert all(t.error_y.array is None for t in fig.data)
    assert fig.layout.annotations[0].text == "decode tokens/s"


def test_the_shipped_h200_1b_recording_names_the_async_gain_with_its_interval() -> None:
    rec = load_recording(RECORDINGS_DIR / "h200-llama-1b.jsonl")
    windows = rec.by_mode()
    assert list(windows) == ["sync+graphs", "async+graphs"]
    v = decode_verdict([windows["sync+graphs"]], [windows["async+graphs"]],
                       a_label="sync+graphs", b_label="async+graphs")
    assert v.measurable and "no measurable difference" not in v.text
    m = re.search(r"async\+graphs is (\d+\.\d)% faster than sync\+graphs\*\* \(95% interval "
                  r"\+(\d+\.\d)% to \+(\d+\.\d)%", v.text)
    assert m, v.text
    gain, lo, hi = (float(x) for x in m.groups())
    assert 0 < lo < gain < hi
    # The same gain from the recording's own figures: decode tokens over the decode-only
    # steps' time, each side (independent of the bootstrap).
    a, b = decode_of(windows["sync+graphs"]), decode_of(windows["async+graphs"])
    assert gain == pytest.approx(100 * (b.tokens_per_s / a.tokens_per_s - 1), abs=0.06)
    assert lo > 20  # the recording's async gain is large: never "no difference"
    busy = re.search(r"sync\+graphs (\d+\.\d)%, async\+graphs (\d+\.\d)%", v.text)
    assert busy and float(busy.group(1)) < 80 < 99 < float(busy.group(2))


@pytest.mark.parametrize(("ms", "text"), [(0.3862, "0.386 ms"), (23.4321, "23.43 ms"),
                                          (126.056, "126.1 ms"), (1234.5, "1,234 ms"),
                                          (float("nan"), "–")])
def test_a_tile_duration_keeps_four_figures(ms: float, text: str) -> None:
    """"126.056 ms" and "23.432 ms" were cut in their tiles ("126.056 ...", "23.43...")."""
    assert short_ms(ms) == text


def test_each_sides_header_counts_each_figure_over_what_it_covers(fake) -> None:
    """The one-click comparison draws each side's last capture and judges every capture:
    the header says which count covers which (it once read "5 steps in 1.00 s, 11 of them
    decode-only"), and the tiles and the idle chart say their scope."""
    from test_pages_fake import app

    at = app().run()
    at.switch_page("ui/pages/ab.py").run()
    at.select_slider(key="ab.seconds").set_value(1)
    at.button(key="ab.one_click").click().run()
    headers = [m.value for m in at.markdown
               if m.value.startswith("**") and " steps in " in m.value]
    assert len(headers) == 2, headers
    for h in headers:
        assert "(the last capture, drawn)" in h and "in all 3 captures, judged" in h, h
    helps = {m.label: m.help for m in at.metric}
    assert "all 3 captures" in helps["compute busy (decode)"]
    assert "every step of the window drawn" in helps["compute busy (decode)"]
    figure = next(c for c in at.get("plotly_chart") if c.key == "ab.view.figure")
    assert "all steps drawn" in figure.proto.spec


def test_one_window_counts_its_decode_only_steps_among_its_steps() -> None:
    rec = load_recording(RECORDINGS_DIR / "cpu-tiny.jsonl")
    w = rec.by_mode()["sync"]
    s = window_stats(w, "sync")
    n = decode_of(w).n
    header = side_header(s, n, 1)
    assert header.endswith(f"{n:,} of them decode-only") and n <= s.steps
