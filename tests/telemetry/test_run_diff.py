"""Two runs diffed (telemetry.run_diff): step times grouped by kind and batch size with each
group's median change and its 95% interval (telemetry.verdict.median_change), the decode
verdict the A/B page gives, the waterfall and kernel families per step, and what two runs do
not share said in words: the shipped H200 1B recording's sync and async windows, the two
CPU recordings, an H200 run against a CPU run, and hand-made steps."""

from __future__ import annotations

import pytest
from test_verdict import noisy

from telemetry.kernels import KernelRecord, SampledStep, make_sample
from telemetry.records import Span, StepRecord
from telemetry.run_diff import (
    DECODE_ONLY,
    WITH_PREFILL,
    Run,
    batch_labels,
    diff_runs,
    family_time,
    recording_facts,
    step_times,
    waterfall_per_step,
)
from telemetry.verdict import decode_verdict, median_change
from telemetry.waterfall import UNSPLIT
from ui.figures.recordings import RECORDINGS_DIR, load_recording

MS = 1_000_000


def steps(times_ms: list[float], *, batch: int | list[int] = 8, prefill_at: tuple[int, ...] = (),
          first: int = 0, mode: str = "sync") -> list[StepRecord]:
    """Serial steps: step k's compute takes times_ms[k] (a 10% CPU prepare before it), so
    its period (previous end to its end) is times_ms[k]."""
    out, t = [], 0
    for k, ms in enumerate(times_ms):
        length = int(ms * MS)
        cpu = length // 10
        n = batch[k] if isinstance(batch, list) else batch
        pre = k in prefill_at
        out.append(StepRecord(step=first + k, mode=mode, slot=k % 2,  # type: ignore[arg-type]
                              num_requests=n, prefill_tokens=256 if pre else 0,
                              decode_tokens=0 if pre else n,
                              spans=[Span("cpu.prepare", t, t + cpu),
                                     Span("compute", t + cpu, t + length)]))
        t += length
    return out


def recording_run(name: str, window: str) -> Run:
    rec = load_recording(RECORDINGS_DIR / name)
    return Run(window, rec.by_mode()[window], recording_facts(rec.meta))


@pytest.fixture(scope="module")
def h200_sync_async():
    return diff_runs(recording_run("h200-llama-1b.jsonl", "sync+graphs"),
                     recording_run("h200-llama-1b.jsonl", "async+graphs"))


def test_step_times_are_periods_by_kind_and_batch_and_the_first_step_has_none() -> None:
    recs = steps([5.0, 2.0, 30.0, 2.0], batch=[4, 4, 8, 8], prefill_at=(2,))
    got = step_times(recs)
    assert [(t.step, t.kind, t.batch) for t in got] == [
        (1, DECODE_ONLY, 4), (2, WITH_PREFILL, 8), (3, DECODE_ONLY, 8)]
    assert [t.ms for t in got] == pytest.approx([2.0, 30.0, 2.0])
    # a gap in step numbers: the step after it has no predecessor here, so no period
    assert [t.step for t in step_times([recs[0], recs[1], recs[3]])] == [1]


def test_many_batch_sizes_are_binned_by_powers_of_two() -> None:
    assert batch_labels([1, 8, 32]) == {1: "1", 8: "8", 32: "32"}
    labels = batch_labels(list(range(1, 40)))
    assert labels[1] == "1" and labels[3] == "3-4" and labels[17] == labels[32] == "17-32"
    assert labels[33] == "33-64"


def test_the_h200_1b_async_window_is_faster_at_batch_32_with_its_interval(
        h200_sync_async) -> None:
    """The shipped recording's decode-only steps at batch 32 (251 a side): async's median
    step is about a quarter shorter, and the interval says so; groups of one step are not
    judged."""
    groups = {(g.kind, g.batch): g for g in h200_sync_async.groups}
    g = groups[(DECODE_ONLY, "32")]
    assert g.a_ms.size == g.b_ms.size == 251
    assert g.verdict.kind == "faster"
    c = g.verdict.change
    assert c is not None and c.hi < 0 and -35 < c.estimate < -15
    assert c.lo <= c.estimate <= c.hi
    assert groups[(DECODE_ONLY, "1")].verdict.kind == "too few"
    assert groups[(WITH_PREFILL, "32")].verdict.kind == "too few"
    assert (WITH_PREFILL, "8") not in groups  # the window's first step: no period


def test_the_decode_verdict_is_the_ab_pages_own(h200_sync_async) -> None:
    d = h200_sync_async
    same = decode_verdict([d.a.records], [d.b.records], a_label="sync+graphs",
                          b_label="async+graphs")
    assert d.decode.text == same.text
    assert "async+graphs is" in d.decode.text and "faster than sync+graphs" in d.decode.text


def test_one_window_against_another_of_one_recording_differs_by_mode_only(
        h200_sync_async) -> None:
    d = h200_sync_async
    assert [n.text for n in d.notes] == [
        "Differs: mode: sync vs async. The figures below show its effect."]
    facets = {f.name: f for f in d.facets}
    assert facets["device"].same and facets["device"].a == "NVIDIA H200"
    assert facets["CUDA graphs"].same and facets["CUDA graphs"].a == "on"
    assert not facets["mode"].same


def test_an_h200_run_against_a_cpu_run_says_what_is_not_comparable() -> None:
    """Diffed all the same (each side's groups and waterfall), with device and model named
    as not comparable first, and the batch sizes only one run saw."""
    d = diff_runs(recording_run("h200-llama-1b.jsonl", "async+graphs"),
                  recording_run("cpu-tiny2.jsonl", "async"))
    first = d.notes[0]
    assert first.serious
    assert "Not comparable: device: NVIDIA H200 vs CPU (x86_64)" in first.text
    assert "model: llama-1b shape, random bfloat16 weights vs tiny shape" in first.text
    texts = " ".join(n.text for n in d.notes)
    assert "CUDA graphs: on vs off" in texts
    assert ("Seen by one run only (A only: decode-only 1, 9, 17, 24, 32, with "
            "prefill 16, 24, 32; B only: decode-only 4)") in texts
    assert all(w is not None for w in d.waterfalls)
    assert {g.batch for g in d.groups if g.b_ms.size} == {"4"}
    assert not any(g.shared for g in d.groups)


def test_two_cpu_recordings_share_device_model_and_workload_and_name_the_commits() -> None:
    d = diff_runs(recording_run("cpu-tiny.jsonl", "async"),
                  recording_run("cpu-tiny2.jsonl", "async"))
    assert not any(n.serious for n in d.notes)
    facets = {f.name: f for f in d.facets}
    assert all(facets[k].same for k in ("device", "model", "workload", "mode", "batch sizes"))
    assert not facets["commit"].same
    assert any(n.text.startswith(f"Also differs: commit: {facets['commit'].a} vs ")
               for n in d.notes)
    (g,) = [g for g in d.groups if g.shared]
    assert (g.kind, g.batch) == (DECODE_ONLY, "4") and g.verdict.change is not None


def test_runs_whose_device_is_not_known_say_so() -> None:
    d = diff_runs(Run("a", steps([2.0] * 12)), Run("b", steps([2.0] * 12)))
    assert [n.text for n in d.notes] == [
        "Unknown for one run or both: device, model (a recording without a meta line does "
        "not say)."]


def test_a_slower_batch_is_found_and_an_unchanged_one_is_not() -> None:
    a = steps(noisy(60, 2.0, 0.005, 1) + noisy(60, 4.0, 0.005, 2), batch=[8] * 60 + [16] * 60)
    b = steps(noisy(60, 2.0, 0.005, 3) + noisy(60, 5.2, 0.005, 4), batch=[8] * 60 + [16] * 60)
    groups = {g.batch: g.verdict for g in diff_runs(Run("A", a), Run("B", b)).groups}
    assert groups["16"].kind == "slower" and groups["16"].change is not None
    assert groups["16"].change.estimate == pytest.approx(30, abs=2)
    assert groups["8"].kind == "no measurable difference"


def test_the_median_change_is_not_moved_by_one_long_stall() -> None:
    """One stall of a second among 100 steps of 2 ms (it would add 50% to the mean): the
    medians compare the steps a user sees, and the change stays within a percent or two."""
    a = noisy(100, 2.0, 0.01, 5)
    b = noisy(100, 2.0, 0.01, 6)
    calm = median_change(a, b)
    b[50] = 1000.0
    c = median_change(a, b)
    assert c is not None and calm is not None
    assert abs(c.estimate - calm.estimate) < 0.5
    assert -2 < c.lo <= c.hi < 2
    assert median_change(a[:4], b) is None  # too few steps on one side
    assert median_change([0.0] * 10, b) is None  # a step time must be positive


def test_the_waterfall_per_step_adds_up_to_a_step(h200_sync_async) -> None:
    for w in h200_sync_async.waterfalls:
        assert w is not None and not w.split  # the 1B recording has no kernel samples
        assert set(w.parts_ms) >= {UNSPLIT, "idle_cpu", "no_work"}
        assert sum(w.parts_ms.values()) == pytest.approx(w.step_ms, rel=1e-6)
    sync, async_ = h200_sync_async.waterfalls
    assert sync is not None and async_ is not None
    assert async_.parts_ms["idle_cpu"] < sync.parts_ms["idle_cpu"] / 10  # async hides the CPU


def kernel(name: str, family: str, a: int, b: int) -> KernelRecord:
    return KernelRecord(name, family, a, b)


def test_kernel_time_per_sampled_step_by_family() -> None:
    recs = steps([1.0] * 4)
    assert family_time(recs) is None  # a CPU run: no kernel samples
    sample = make_sample([
        SampledStep(1, [kernel("bitwise_not", "marker", 0, 10), kernel("nvjet", "gemm", 10, 810),
                        kernel("attn", "attention", 810, 1010)]),
        SampledStep(2, [kernel("nvjet", "gemm", 2000, 2600)])], next_start_ns=None)
    recs[3].kernel_samples = [sample]
    got = family_time(recs)
    assert got is not None and got.sampled_steps == 2
    assert got.us_per_step == pytest.approx({"gemm": 0.7, "attention": 0.1})  # marker left out
    # the sample rides on step 3; a window that starts there holds none of its steps
    assert family_time(recs[3:]) is None
    late = family_time(recs[2:])
    assert late is not None and late.us_per_step == pytest.approx({"gemm": 0.6})
    wf = waterfall_per_step(recs)
    assert wf is not None and wf.split and "floor" in wf.parts_ms and UNSPLIT not in wf.parts_ms


def test_a_recording_with_kernel_samples_gives_families_per_step() -> None:
    rec = load_recording(RECORDINGS_DIR / "h200-smollm2-135m.jsonl")
    got = family_time(rec.steps)
    assert got is not None and got.sampled_steps > 0
    assert max(got.us_per_step, key=got.us_per_step.__getitem__) == "gemm"


def test_a_run_without_steps_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="run 'empty' has no steps"):
        diff_runs(Run("empty", []), Run("b", steps([1.0] * 3)))
