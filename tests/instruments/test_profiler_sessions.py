"""Traces whose CUDA events lost their times: Kineto
converts CUDA times at export with the latest session's converter, so a trace written after
another session started has its kernels, copies and runtime calls at ts 0 while its CPU ops
and ranges keep real times. On a CPU, from synthetic traces shaped like a GPU's: the check
finds them, the sampler drops them, no session of ours starts while a trace waits to be
written, and the anatomy records once more, saying why."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from engine.instruments import anatomy as anatomy_mod
from engine.instruments import profiler_sessions as sessions
from engine.instruments.anatomy import AnatomyRecorder, record_anatomy
from engine.instruments.kernel_sampler import KernelSampler, to_sample
from telemetry.anatomy import STEP_MARKER

T0 = 5_520_571_979_001.855  # us, as in a GPU trace (relative to Kineto's base time)


def gpu_like(zeroed: bool, steps=(2, 3), real_head: int = 4) -> list[dict]:
    """A CPU + CUDA anatomy trace: the session span, one range per step holding a graph
    launch, and the graph's kernels. ``zeroed``: every CUDA event at ts 0, dur 0 except the
    first ``real_head`` (a zeroed trace keeps a handful with real times)."""
    ev = [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": T0, "dur": 9484.9}]
    cuda = []
    for i, n in enumerate(steps):
        t = T0 + 1000 + 1000 * i
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"{STEP_MARKER}{n}", "ts": t,
                   "dur": 600, "tid": 1})
        cuda.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
                     "ts": t + 10, "dur": 20, "tid": 1, "args": {"correlation": 100 + n}})
        for k in range(8):
            cuda.append({"ph": "X", "cat": "kernel", "name": f"nvjet_gemm_{k}",
                         "ts": t + 50 + 40 * k, "dur": 30, "args": {"correlation": 100 + n}})
    if zeroed:
        for e in cuda[real_head:]:
            e["ts"], e["dur"] = 0.0, 0.0
    return ev + cuda


def test_a_trace_with_its_cuda_events_at_ts_0_is_found_and_a_good_one_passes():
    assert sessions.clock_lost(gpu_like(zeroed=False)) is None
    why = sessions.clock_lost(gpu_like(zeroed=True))
    assert why is not None and "14 of 18 CUDA events at ts 0" in why
    # a few at 0 among real times are not judged; times far outside the session's span are
    few = gpu_like(zeroed=True, real_head=15)
    assert sessions.clock_lost(few) is None
    shifted = gpu_like(zeroed=False)
    for e in shifted:
        if e["cat"] in sessions.CUDA_CATS:
            e["ts"] += 5e6  # 5 s after the session ended
    assert "18 outside the session's span" in sessions.clock_lost(shifted)
    assert sessions.clock_lost([]) is None  # no CUDA events (a CPU trace): nothing to judge


def test_the_sampler_drops_a_zeroed_trace_and_releases_its_hold(monkeypatch):
    import time

    from engine.instruments import kernel_sampler

    def convert(*job):
        raise sessions.ClockLost("kernel sampler: 14 of 18 CUDA events at ts 0")

    monkeypatch.setattr(kernel_sampler, "convert", convert)
    s = KernelSampler(enabled=True, period_s=0.05)
    s._submit((None, 1, 1, {}, 0, {}), sessions.hold())
    deadline = time.monotonic() + 5
    while s._converted < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    s.close()
    assert s.clock_lost == 1 and s.samples_made == 0 and "ts 0" in s.last_error
    assert not sessions.unsaved()


def test_no_session_of_ours_starts_while_a_trace_waits_to_be_written(monkeypatch):

    started = []
    monkeypatch.setattr(sessions, "prime_profiler", lambda: None)
    monkeypatch.setattr(sessions, "start_kineto", lambda with_cpu: started.append("sampler"))
    s = KernelSampler(enabled=True, period_s=0.05)
    s._side = object()  # no CUDA stream on a CPU
    s.next_at = 0.0
    rec = _Recorder(lambda r: started.append("anatomy"))
    token = sessions.hold()
    try:
        assert s.begin_step(5) is False and not s.open
        req = rec.request(2, "/tmp")
        assert rec.begin_step(5) is None and rec.active  # waits, still pending
        assert req.first_step is None and started == []
    finally:
        sessions.release(token)
    assert rec.begin_step(6) is None and req.first_step == 6 + rec.warmup
    assert started == ["anatomy"]
    assert s.begin_step(7) is True and started == ["anatomy", "sampler"]


def test_a_stale_hold_stops_nothing_for_ever(monkeypatch):
    token = sessions.hold()
    assert sessions.unsaved()
    monkeypatch.setattr(sessions, "STALE_S", 0.0)
    assert not sessions.unsaved()
    sessions.release(token)  # already dropped: a no-op


class _Recorder(AnatomyRecorder):
    """A CUDA recorder whose profiler start is ``on_start(self)``."""

    def __init__(self, on_start) -> None:
        super().__init__(cuda=True)
        self.on_start = on_start

    def _start(self) -> None:
        self.on_start(self)


class _Prof:
    """Stands in for torch.profiler.profile: writes the next of ``traces`` on export."""

    def __init__(self, traces: list[list[dict]]) -> None:
        self.traces = traces

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"traceEvents": self.traces.pop(0)}, f)


def _drive(recorder: AnatomyRecorder, stop: threading.Event) -> None:
    """The loop thread's part: begin_step / step_done for steps 0, 1, 2, ..."""
    step = 0
    while not stop.is_set():
        if recorder.active:
            recorder.begin_step(step)
            recorder.step_done(step)
        step += 1
        stop.wait(0.001)


@pytest.mark.parametrize("bad", [1, 2])
def test_the_anatomy_records_once_more_when_its_trace_lost_the_cuda_times(
        monkeypatch, tmp_path, bad):
    traces = [gpu_like(zeroed=True)] * bad + [gpu_like(zeroed=False, steps=(4, 5))]
    prof = _Prof(list(traces))

    def start(r: AnatomyRecorder) -> None:
        assert not sessions.unsaved(), "a session started while a trace was unwritten"
        r._prof = prof

    rec = _Recorder(start)
    rec.warmup = 0
    engine = SimpleNamespace(instruments=SimpleNamespace(anatomy=rec))
    stop = threading.Event()
    loop = threading.Thread(target=_drive, args=(rec, stop), daemon=True)
    loop.start()
    try:
        if bad == 2:
            with pytest.raises(sessions.ClockLost, match="recorded twice"):
                record_anatomy(engine, 2, timeout_s=10, trace_dir=str(tmp_path))
            return
        out = record_anatomy(engine, 2, timeout_s=10, trace_dir=str(tmp_path))
    finally:
        stop.set()
        loop.join(5)
    assert out.retried is not None and "discarded" in out.retried and "ts 0" in out.retried
    assert [len(s.kernels) for s in out.steps] == [8, 8]
    assert not sessions.unsaved()  # every hold released
    assert anatomy_mod.anatomy_summary(out)["retried"] == out.retried


def test_a_normal_recording_says_it_was_not_retried():
    assert anatomy_mod.AnatomyRecording(1, "", [], [], 0, "cpu", 0.0).retried is None


def test_to_sample_refuses_a_trace_whose_cuda_times_are_lost():
    events = gpu_like(zeroed=True)
    with pytest.raises(sessions.ClockLost, match="kernel sampler"):
        to_sample(events, first=2, steps=1, marks={2: (0, 1, 2, 3), 3: (4, 5, 6, 7)})
