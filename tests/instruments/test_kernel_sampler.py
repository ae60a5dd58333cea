"""The kernel sampler's trace conversion on a CPU, from a synthetic Kineto trace: kernels
join the step whose bracket launches hold their launch, land on our clock, the extra step
ends the window, and another thread's launch inside a step's brackets joins no step."""

from __future__ import annotations

import pytest

from engine.instruments.kernel_sampler import (
    KernelSampler,
    LostKernels,
    NoRuntimeEvents,
    to_sample,
)

OFF_US = 1_000_000.0  # the trace clock runs 1 s ahead of ours (in us)
SPIN = "void at::cuda::(anonymous namespace)::spin_kernel(long)"


def rt(name, ts, corr=None, dur=1.0, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts + OFF_US, "dur": dur,
            "tid": tid, "args": {"correlation": corr} if corr is not None else {}}


def kern(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts + OFF_US, "dur": dur,
            "args": {"correlation": corr}}


def trace(steps, foreign_at=None):
    """Each step at t0 = 100 * i us: bracket launches (spin kernels) at t0 and t0 + 10, a
    graph launch at t0 + 5 whose marker and two kernels run at t0 + 20.. A foreign launch (on
    another thread, inside a step's brackets) must join no step."""
    events, marks = [], {}
    for i, n in enumerate(steps):
        t0 = 100.0 * i
        events += [rt("cudaLaunchKernel", t0, corr=1000 + 2 * i),
                   kern(SPIN, t0 + 1, 1, 1000 + 2 * i),
                   rt("cudaGraphLaunch", t0 + 5, corr=n),
                   rt("cudaLaunchKernel", t0 + 10, corr=1001 + 2 * i),
                   kern(SPIN, t0 + 11, 1, 1001 + 2 * i),
                   kern("void at::native::bitwise_not_kernel_cuda", t0 + 20, 2, n),
                   kern("nvjet_gemm_bf16", t0 + 23, 30, n),
                   kern("paged_attention_kernel", t0 + 54, 10, n),
                   {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)",
                    "ts": t0 + 70 + OFF_US, "dur": 3, "args": {"correlation": n}}]
        ns = int(t0 * 1000)
        marks[n] = (ns, ns + 1000, ns + 10_000, ns + 11_000)
    if foreign_at is not None:
        events += [rt("cudaLaunchKernel", foreign_at, corr=999, tid=2),
                   kern("foreign_kernel", foreign_at + 30, 5, 999)]
    return events, marks


@pytest.mark.parametrize("foreign", [None, 7.0])
def test_kernels_join_their_step_on_our_clock(foreign):
    events, marks = trace([7, 8, 9], foreign)
    sample = to_sample(events, first=7, steps=2, marks=marks)
    assert sample is not None and sample.aligned == "brackets"
    assert [s.step for s in sample.steps] == [7, 8]
    s7 = sample.steps[0]
    # no host copy, no bracket kernel, no other thread's kernel
    assert [k.family for k in s7.kernels] == ["marker", "gemm", "attention"]
    assert s7.kernels[1].start_ns == 23_000 and s7.kernels[1].end_ns == 53_000
    assert [k.family for k in s7.work] == ["gemm", "attention"]
    # the window: step 7's first kernel to step 9's first kernel (two whole periods)
    assert sample.window == (20_000, 220_000)
    assert sample.kernel_ns == 2 * (2_000 + 30_000 + 10_000)
    # the sampler's own bracket launches of steps 8 and 9 (1 us each, inside the window, GPU
    # idle) are not the engine's time: 4 us left out of busy
    assert sample.bracket_idle_ns == 4_000
    assert sample.busy == pytest.approx(84 / 196)


def test_bracket_launches_missed_at_the_profiler_start_lose_only_that_step():
    events, marks = trace([7, 8, 9])
    events = [e for e in events if (e.get("args") or {}).get("correlation") != 1000]
    sample = to_sample(events, first=7, steps=2, marks=marks)
    assert sample is not None and [s.step for s in sample.steps] == [8]
    assert sample.steps[0].kernels[1].start_ns == 123_000


def test_a_graph_step_that_lost_its_first_kernels_is_left_out_not_counted_short():
    """Kineto/CUPTI drop the first kernel records of a session (pytorch/pytorch#192021): a
    graph step whose marker (its first kernel) is gone lost some of its work, and counting
    the rest would read the GPU as idler than it was. The window starts at the next step."""
    events, marks = trace([7, 8, 9])
    events = [e for e in events if not (e["cat"] == "kernel" and "bitwise_not" in e["name"]
                                        and e["args"]["correlation"] == 7)]
    sample = to_sample(events, first=7, steps=2, marks=marks)
    assert sample is not None and [s.step for s in sample.steps] == [8]
    assert sample.skipped_steps == 1 and sample.window == (120_000, 220_000)
    assert sample.busy == pytest.approx(42 / 98)  # one whole period, its bracket left out


def test_a_step_whose_first_launch_lost_its_kernel_is_left_out_and_counted():
    events, marks = trace([7, 8, 9])
    events.append(rt("cudaLaunchKernel", 3.0, corr=5000))  # step 7's first, its kernel lost
    sample = to_sample(events, first=7, steps=2, marks=marks)
    assert sample is not None and [s.step for s in sample.steps] == [8]
    assert sample.lost_launches == 1 and sample.skipped_steps == 1
    # A launch without a record after the step's first kept one is not the session-start
    # loss: the step stays (the count still says the trace lacks one).
    events, marks = trace([7, 8, 9])
    events.append(rt("cudaLaunchKernel", 7.0, corr=5000))
    sample = to_sample(events, first=7, steps=2, marks=marks)
    assert [s.step for s in sample.steps] == [7, 8] and sample.lost_launches == 1


def test_a_trace_that_lost_every_kernel_says_so():
    events, marks = trace([7, 8, 9])
    events = [e for e in events if e["cat"] != "kernel"]
    with pytest.raises(LostKernels, match="192021"):
        to_sample(events, first=7, steps=2, marks=marks)


def test_a_trace_without_runtime_events_asks_for_the_fallback():
    events, marks = trace([1, 2])
    events = [e for e in events if e["cat"] != "cuda_runtime"]
    with pytest.raises(NoRuntimeEvents):
        to_sample(events, first=1, steps=1, marks=marks)


def test_sampler_arguments_are_checked_and_it_stays_off_on_a_cpu():
    with pytest.raises(ValueError, match="kernel_sample_period_s must be 0"):
        KernelSampler(enabled=True, period_s=0.01)
    with pytest.raises(ValueError, match="steps must be an int"):
        KernelSampler(enabled=True, steps=0)
    assert not KernelSampler(enabled=False).armed
    assert not KernelSampler(enabled=True, period_s=0).armed


class _Ev:
    """A stand-in for torch's KinetoEvent, built from a Chrome-trace event."""

    def __init__(self, e, shift_ns=0):
        from torch._C._autograd import DeviceType

        self.e, self.shift = e, shift_ns
        self.dev = DeviceType.CPU if e["cat"] == "cuda_runtime" else DeviceType.CUDA

    def name(self):
        return self.e["name"]

    def device_type(self):
        return self.dev

    def start_ns(self):
        return round(self.e["ts"] * 1000) + self.shift

    def end_ns(self):
        return self.start_ns() + round(self.e["dur"] * 1000)

    def start_thread_id(self):
        return self.e.get("tid", 0)

    def correlation_id(self):
        return (self.e.get("args") or {}).get("correlation", 0)


class _Result:
    def __init__(self, events, shift_gemm_ns=0):
        self._json = events
        self._objs = [_Ev(e, shift_gemm_ns if "gemm" in e["name"] else 0) for e in events]

    def events(self):
        return self._objs

    def save(self, path):
        import json

        with open(path, "w") as f:
            json.dump({"traceEvents": self._json}, f)


@pytest.mark.parametrize("shift_ns", [0, 5_000])
def test_objects_are_trusted_only_if_they_agree_with_the_export(monkeypatch, shift_ns):
    from engine.instruments import kernel_sampler

    monkeypatch.setattr(kernel_sampler, "READ_OBJECTS", False)  # restored after the test
    monkeypatch.setattr(kernel_sampler, "READ_TIMES", {})
    kernel_sampler.set_trace_reader("compare")
    events, marks = trace([7, 8, 9])
    sample = kernel_sampler.convert(_Result(events, shift_ns), 7, 2, marks)
    t = kernel_sampler.READ_TIMES
    # trusted when they agree, and used when also faster than the export
    assert kernel_sampler.READ_OBJECTS is (shift_ns == 0 and t["objects_s"] < t["json_s"])
    # either way the sample is the export's (5 us off is not "the same")
    assert sample is not None and sample.steps[0].kernels[1].start_ns == 23_000
    again = kernel_sampler.convert(_Result(events, shift_ns), 7, 2, marks)
    assert again is not None and again.steps[0].kernels[1].start_ns == 23_000


def test_a_trace_reader_outside_the_three_is_refused_naming_them(monkeypatch):
    from engine.instruments import kernel_sampler

    monkeypatch.setattr(kernel_sampler, "READ_OBJECTS", False)
    with pytest.raises(ValueError, match="one of json, objects, compare, got 'fast'"):
        kernel_sampler.set_trace_reader("fast")
    assert kernel_sampler.READ_OBJECTS is False
    kernel_sampler.set_trace_reader("objects")
    assert kernel_sampler.READ_OBJECTS is True


def test_no_new_sample_starts_while_the_last_one_converts():
    s = KernelSampler(enabled=True, period_s=0.05)
    s.next_at = 0.0
    s._submitted = 1  # handed to the worker, not converted yet
    assert s.begin_step(5) is False and not s.open


def test_bracket_time_counts_only_where_the_gpu_was_idle():
    from telemetry.kernels import idle_overlap_ns

    kernels = [(100, 200), (300, 400)]
    # fully idle, half under a kernel, fully under a kernel, outside the window
    spans = [(50, 60), (190, 210), (320, 330), (500, 600)]
    assert idle_overlap_ns(spans, kernels, 0, 450) == 10 + 10 + 0 + 0


def test_samples_that_lost_their_kernels_are_counted_until_a_good_one(monkeypatch):
    """The engine's stats carry the sampler's state, so the Live page can say when the
    profiler came back without kernel records (CUPTI can drop them) instead of
    showing a lane that looks idle."""
    import queue

    from engine.instruments import kernel_sampler
    from engine.instruments import profiler_sessions as sessions
    from telemetry.kernels import KernelRecord, SampledStep, make_sample

    good = make_sample([SampledStep(1, [KernelRecord("nvjet", "gemm", 0, 10)])], None)
    outcomes = [LostKernels("kernel sampler: 0 bracket launches (192021)"),
                LostKernels("again"), good]

    def convert(*job):
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    monkeypatch.setattr(kernel_sampler, "convert", convert)
    s = KernelSampler(enabled=False)
    assert s.stats()["kernel_samples_lost_in_row"] == 0
    assert s.stats()["kernel_sampler_error"] == ""

    def run(n: int) -> None:
        s._jobs = queue.SimpleQueue()
        for _ in range(n):
            s._jobs.put(((None, 0, 1, {}, 0, {}), sessions.hold()))
        s._jobs.put(None)
        s._work()

    run(2)
    st = s.stats()
    assert st["kernel_samples_lost"] == 2 and st["kernel_samples_lost_in_row"] == 2
    assert st["kernel_sampler_error"] == "LostKernels: again"
    run(1)
    st = s.stats()
    assert st["kernel_samples_made"] == 1 and st["kernel_samples_lost_in_row"] == 0
    assert st["kernel_samples_lost"] == 2 and not sessions.unsaved()
