"""The slots figure (ui/figures/slots.py) of real CPU engine runs and of a shipped recording:
steps on their slots, the steps async mode read alone marked by reason, sync steps as sync,
and each slot's input wait."""

from __future__ import annotations

import pytest
from engine_checks import mixed_prompts

from engine import Engine, EngineConfig, SamplingParams
from telemetry.records import StepRecord, SyncFallback
from ui.figures.recordings import RECORDINGS_DIR, load_recording
from ui.figures.slots import fallback_counts, slot_rows, slot_summaries, slots_figure

ROOMY = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=16, block_size=4,
             num_blocks=200, max_model_len=96)


def engine_run(model_dir, **settings) -> list[StepRecord]:
    eng = Engine(EngineConfig(model=str(model_dir), **{**ROOMY, **settings}), start=False)
    reader = eng.bus.reader()
    try:
        for p in mixed_prompts(4, seed=5):
            eng.submit(p, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        while eng.step() or eng.scheduler.num_unfinished or eng.loop.inflight is not None:
            pass
    finally:
        eng.shutdown()
    return sorted(reader.steps(), key=lambda r: r.step)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


def traces(fig) -> dict[str, object]:
    return {t.name: t for t in fig.data if t.type == "scattergl"}  # the left panel


def test_one_slot_async_run_is_marked_read_alone_step_by_step(model_dir):
    recs = engine_run(model_dir, async_batching=True, num_slots=1)
    fig = slots_figure(recs)
    by_name = traces(fig)
    single = by_name[f"read alone: single slot ({len(recs) - 1})"]
    assert list(single.x) == [r.step for r in recs[:-1]]
    assert "read alone: single slot (one slot" in single.hovertemplate
    assert [w for w, _ in single.customdata] == [r.input_wait_ns / 1e6 for r in recs[:-1]]
    assert [s for _, s in single.customdata] == [r.slot_wait_ns / 1e6 for r in recs[:-1]]
    assert list(by_name["read alone: nothing scheduled (1)"].x) == [recs[-1].step]
    assert "slot 0" not in by_name  # every step of it is marked, none plain
    title = fig.layout.title.text
    assert title.startswith(f"{len(recs)} steps on 1 slot · read alone: ")
    assert f"{len(recs) - 1} single slot" in title


def test_two_slots_alternate_and_sync_steps_are_sync(model_dir):
    recs = engine_run(model_dir, async_batching=True, num_slots=2)
    by_name = traces(slots_figure(recs))
    assert set(by_name["slot 0"].y) == {0} and set(by_name["slot 1"].y) == {1}
    assert len(by_name["slot 0"].x) + len(by_name["slot 1"].x) == len(recs) - 1
    sync = engine_run(model_dir, async_batching=False, num_slots=2)
    fig = slots_figure(sync)
    names = set(traces(fig))
    assert "sync step" in names and not any(n.startswith("read alone") for n in names)
    assert fig.layout.title.text.endswith("none read alone")
    assert fallback_counts(sync) == {}


def test_input_wait_boxes_and_rows_per_slot(model_dir):
    recs = engine_run(model_dir, async_batching=True, num_slots=2)
    boxes = [t for t in slots_figure(recs).data if t.type == "box"]
    assert [b.name for b in boxes] == ["slot 0", "slot 1"]
    for box, summary in zip(boxes, slot_summaries(recs), strict=True):
        assert list(box.x) == [w / 1e6 for w in summary.input_wait_ns]
        assert min(box.x) >= 0
    rows = slot_rows(slot_summaries(recs))
    assert [(r["slot"], r["mode"]) for r in rows] == [(0, "async"), (1, "async")]
    assert sum(r["steps"] for r in rows) == len(recs)
    assert all(r["input wait p50 ms"] <= r["input wait p99 ms"] for r in rows)
    assert any("nothing scheduled" in r["read alone"] for r in rows)


@pytest.mark.parametrize("name", ["cpu-tiny.jsonl", "h200-llama-1b.jsonl"])
def test_a_recording_made_before_slot_facts_draws_its_slots_mode_by_mode(name):
    """Its input waits come from the spans; its async steps' inputs wait for the step before
    (the overlap), its sync steps' only for the copy: one box per slot and mode."""
    rec = load_recording(RECORDINGS_DIR / name)
    assert all(r.sync_fallback is None and r.slot_wait_ns == 0 for r in rec.steps)
    fig = slots_figure(rec.steps)
    assert fig.layout.title.text.endswith("none read alone")
    boxes = [t.name for t in fig.data if t.type == "box"]
    assert boxes == ["slot 0 · async", "slot 0 · sync", "slot 1 · async", "slot 1 · sync"]
    p50 = {(r["slot"], r["mode"]): r["input wait p50 ms"]
           for r in slot_rows(slot_summaries(rec.steps))}
    for slot in (0, 1):
        assert p50[slot, "async"] > 10 * p50[slot, "sync"]


def test_a_hand_built_record_with_a_plain_reason_reads_as_the_reason():
    rec = StepRecord(step=3, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                     decode_tokens=1, sync_fallback="live settings")  # type: ignore[arg-type]
    assert fallback_counts([rec]) == {SyncFallback.LIVE_SETTINGS: 1}
    assert "read alone: live settings (1)" in traces(slots_figure([rec]))
