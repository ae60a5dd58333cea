"""Stalls injected into a real engine (a small Llama on the CPU) are found with the right cause:
a sleep in the host path, a forced full GC, a slow live-settings change, a preemption's
recompute, a sentinel check, an unusual prefill, a step thread kept off its CPU; and a run
with nothing injected names no cause it has no fact for."""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from descheduling import keep_off_cpu
from tiny_models import save_tiny_model

from engine import Engine, EngineConfig, SamplingParams
from telemetry.records import StepRecord
from telemetry.stalls import (
    CPU_DESCHEDULED,
    ENGINE_COMMAND,
    GC,
    GRAPH_CAPTURE,
    HOST_WAIT,
    PREEMPTION,
    PREFILL_CHUNK,
    SENTINEL_CHECK,
)

now = time.perf_counter_ns
SHORT = [5, 6, 7, 8, 9, 10, 11, 12]  # an 8-token prompt


def prompt(n: int) -> list[int]:
    """An n-token prompt within the tiny vocabulary."""
    return [5 + i % 300 for i in range(n)]

# Causes a run without commands, preemptions, sentinel, graphs or prompts of unusual size has
# no fact for; a GC, a thread off its CPU or blocked, and "unexplained" can happen in any run.
NEVER_UNPROVOKED = {ENGINE_COMMAND, PREEMPTION, SENTINEL_CHECK, PREFILL_CHUNK, GRAPH_CAPTURE}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wide enough that a step's time follows its tokens (a 500-token prefill is tens of
    decode steps), small enough for a loaded CPU."""
    return save_tiny_model("llama", tmp_path_factory.mktemp("stalls"), hidden_size=512,
                           intermediate_size=2048, num_hidden_layers=4,
                           max_position_embeddings=1024)


def engine(model_dir: Path, **kw) -> Engine:
    cfg = dict(device="cpu", max_num_seqs=8, max_num_batched_tokens=512, block_size=16,
               num_blocks=256, max_model_len=1024, async_batching=True)
    return Engine(EngineConfig(model=str(model_dir), **{**cfg, **kw}))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def stalls_over(records: list[StepRecord], t0: int, t1: int) -> list[StepRecord]:
    """The stalled steps whose interval overlaps [t0, t1]."""
    out = []
    for r in records:
        end = r.end_ns
        if r.stall and end is not None and end >= t0 and end - r.stall_ns <= t1:
            out.append(r)
    return out


def describe(records: list[StepRecord]) -> str:
    return "\n".join(f"step {r.step}: {r.stall} {r.stall_ns / 1e6:.1f} ms "
                     f"(usually {r.stall_baseline_ns / 1e6:.1f}) {r.stall_detail}"
                     for r in records if r.stall)


def when_tokens(eng: Engine, handle, n: int, timeout_s: float = 60.0) -> None:
    """Wait (on this thread) until ``handle``'s request has produced ``n`` tokens."""
    deadline = time.monotonic() + timeout_s
    while True:
        ids = eng.output_token_ids(handle.request_id)
        if ids is None or len(ids) >= n:
            return
        assert time.monotonic() < deadline, f"{handle.request_id} made no {n} tokens in time"
        time.sleep(0.005)


def run_with(model_dir: Path, inject, *, streams: int = 4, tokens: int = 120, **kw
             ) -> tuple[list[StepRecord], tuple[int, int]]:
    """``streams`` greedy requests; ``inject(eng, handles)`` on this thread once the first
    has 40 tokens returns the (start, end) of what it injected. Returns every step record."""
    with engine(model_dir, **kw) as eng:
        handles = [eng.submit(SHORT, greedy(tokens)) for _ in range(streams)]
        when_tokens(eng, handles[0], 40)
        window = inject(eng, handles)
        for h in handles:
            h.result()
        return eng.bus.snapshot_steps(100_000), window


def on_the_loop(eng: Engine, fn) -> tuple[int, int]:
    """Run ``fn`` inside a request's token callback, i.e. on the engine's loop thread in the
    post phase of a decode step (its fifth delta: its first came with its prefill, a step
    of another kind); returns when it ran."""
    done: dict[str, int] = {}
    ran = threading.Event()
    deltas = []

    def on_delta(_rid: str, _text: str) -> None:
        deltas.append(1)
        if len(deltas) == 5:
            done["start"] = now()
            fn()
            done["end"] = now()
            ran.set()

    eng.submit(SHORT, greedy(30), on_delta=on_delta)
    assert ran.wait(60)
    return done["start"], done["end"]


def test_a_sleep_in_the_host_path_is_a_host_wait(model_dir):
    records, (t0, t1) = run_with(model_dir, lambda eng, hs: on_the_loop(
        eng, lambda: time.sleep(0.5)))
    found = stalls_over(records, t0, t1)
    assert found, f"no stall over the sleep:\n{describe(records)}"
    assert {r.stall for r in found} == {HOST_WAIT}, describe(found)
    assert any("cpu.post +" in r.stall_detail for r in found), describe(found)


def test_a_forced_full_gc_is_named_gc(model_dir):
    junk: list[list[int]] = []

    def collect(eng: Engine, handles) -> tuple[int, int]:
        # Live and tracked, made after the engine froze its heap: a full GC walks it all.
        junk.extend([i] for i in range(2_000_000))
        return on_the_loop(eng, gc.collect)

    try:
        records, (t0, t1) = run_with(model_dir, collect)
    finally:
        junk.clear()
    found = stalls_over(records, t0, t1)
    assert found, f"no stall over the GC ({(t1 - t0) / 1e6:.0f} ms):\n{describe(records)}"
    assert {r.stall for r in found} == {GC}, describe(found)
    assert all("generation 2 GC" in r.stall_detail for r in found)


def test_a_slow_resize_is_an_engine_command(model_dir):
    def resize(eng: Engine, handles) -> tuple[int, int]:
        pipeline = eng.loop.pipeline
        real = pipeline.resize

        def slow(n: int) -> None:  # a large allocation, as on a GPU with big step buffers
            time.sleep(0.5)
            real(n)

        pipeline.resize = slow
        t0 = now()
        assert eng.configure(num_slots=3)["num_slots"] == 3
        return t0, now()

    records, (t0, t1) = run_with(model_dir, resize)
    found = stalls_over(records, t0, t1)
    assert found, f"no stall over the resize:\n{describe(records)}"
    assert {r.stall for r in found} == {ENGINE_COMMAND}, describe(found)
    assert all("num_slots=3" in r.stall_detail for r in found)


def test_a_preempted_requests_recompute_is_a_preemption(model_dir):
    """48 blocks of 16: two streams of 258 tokens and a 300-token prompt that grows do not
    fit; the newest (the long one) is preempted and later recomputed whole (no prefix cache)
    in a step of hundreds of tokens, among steps whose prefills were 8 tokens."""
    with engine(model_dir, num_blocks=48, max_model_len=720, prefix_caching=False) as eng:
        a, b = (eng.submit(SHORT, greedy(250)) for _ in range(2))
        when_tokens(eng, a, 4)
        for _ in range(10):  # short requests, one after another: prefill steps of 8 tokens
            eng.submit(SHORT, greedy(2)).result()
        victim = eng.submit(prompt(300), greedy(400))
        for h in (a, b, victim):
            h.result()
        records = eng.bus.snapshot_steps(100_000)
        preempted = eng.stats()["preemptions"]
    assert preempted >= 1
    recomputes = [r for r in records if r.recomputed_tokens]
    assert recomputes, "no step recomputed a preempted request"
    found = [r for r in records if r.stall == PREEMPTION]
    assert found, f"no preemption stall:\n{describe(records)}"
    assert any("tokens recomputed" in r.stall_detail for r in found)


def test_a_sentinel_check_that_holds_the_compute_thread(model_dir):
    """Finished greedy requests of 400 prompt tokens are re-scored on the compute stream
    between the steps of two running streams."""
    def finish_long_ones(eng: Engine, handles) -> tuple[int, int]:
        t0 = now()
        for _ in range(3):
            eng.submit(prompt(400), greedy(3)).result()
            time.sleep(0.4)  # the check runs after the request ends
        return t0, now()

    records, (t0, t1) = run_with(model_dir, finish_long_ones, streams=2, tokens=250,
                                 sentinel_sample_every=1)
    found = [r for r in stalls_over(records, t0, t1) if r.stall == SENTINEL_CHECK]
    assert found, f"no sentinel stall:\n{describe(records)}"
    assert all("sentinel re-scored" in r.stall_detail for r in found)


def test_an_unusual_prefill_is_a_prefill_chunk(model_dir):
    def long_prompt(eng: Engine, handles) -> tuple[int, int]:
        for _ in range(10):  # prefill steps of 8 tokens, one after another
            eng.submit(SHORT, greedy(2)).result()
        t0 = now()
        eng.submit(prompt(500), greedy(2)).result()
        return t0, now()

    records, (t0, t1) = run_with(model_dir, long_prompt, tokens=200)
    found = [r for r in stalls_over(records, t0, t1) if r.stall == PREFILL_CHUNK]
    assert found, f"no prefill stall:\n{describe(records)}"
    assert any("500 prefill tokens" in r.stall_detail for r in found), describe(found)


def test_a_step_thread_kept_off_its_cpu_is_descheduled(model_dir):
    """The loop and compute threads kept off their CPU for 0.8 s (tests/descheduling.py):
    the steps then wait in the run queue."""
    def off_cpu(eng: Engine, handles) -> tuple[int, int]:
        return keep_off_cpu([eng._thread.native_id, eng.streams.compute_thread()], 0.8)

    records, (t0, t1) = run_with(model_dir, off_cpu, tokens=250)
    found = stalls_over(records, t0, t1)
    causes = Counter(r.stall for r in found)
    assert causes[CPU_DESCHEDULED] >= 1, f"{causes}:\n{describe(records)}"
    assert causes[CPU_DESCHEDULED] >= sum(causes.values()) / 2, describe(found)


def test_a_run_with_nothing_injected_names_no_cause_it_has_no_fact_for(model_dir):
    """Eight streams, nothing injected. A loaded machine may deschedule or block the step
    threads and a GC may run: those stalls are real. Commands, preemptions, sentinel checks
    and unusual prefills did not happen, so no stall may carry them; few stay unexplained."""
    with engine(model_dir) as eng:
        handles = [eng.submit(SHORT, greedy(150)) for _ in range(8)]
        for h in handles:
            h.result()
        records = eng.bus.snapshot_steps(100_000)
    causes = Counter(r.stall for r in records if r.stall)
    assert not set(causes) & NEVER_UNPROVOKED, describe(records)
    assert causes["unexplained"] <= 3 + len(records) // 20, describe(records)


@pytest.mark.cuda
def test_a_graph_capture_is_named_for_itself_not_its_command(model_dir):
    """CUDA graphs turned on while streams decode eagerly: the capture of every slot's
    buckets stalls the next step, named graph_capture rather than the command around it."""
    def graphs_on(eng: Engine, handles) -> tuple[int, int]:
        t0 = now()
        assert eng.configure(cuda_graphs=True)["cuda_graphs"]
        return t0, now()

    records, (t0, t1) = run_with(model_dir, graphs_on, tokens=400, device="cuda",
                                 dtype="bfloat16", attention_backend="triton",
                                 cuda_graphs=False)
    found = stalls_over(records, t0, t1)
    assert found, f"no stall over the capture:\n{describe(records)}"
    assert {r.stall for r in found} == {GRAPH_CAPTURE}, describe(found)
