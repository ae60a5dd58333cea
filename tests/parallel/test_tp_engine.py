"""Tensor parallelism on the CPU (gloo, 2 processes): greedy tokens with tensor_parallel_size 2
equal those with 1 for tiny Llama and Qwen2 (qkv bias) models, sync and async, with chunked
prefill and preemption forced; seeded sampling agrees too (every rank samples the same tokens
from the same gathered logits, or the token tables would drift apart); per-rank spans arrive
on the telemetry bus and line up in time with rank 0's; no worker outlives the engine.

One TP 2 engine per family for the whole module (a start spawns a process that imports torch
and transformers: seconds on a small CPU)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_checks import assert_all_blocks_free, mixed_prompts  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from telemetry.records import rank_lane  # noqa: E402

MAX_NEW = 12
TIGHT = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
             num_blocks=25, max_model_len=96)
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=MAX_NEW, temperature=0.8, top_k=50, top_p=0.9, seed=7,
                         ignore_eos=True)
PROMPTS = mixed_prompts(9)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run(eng: Engine, params: SamplingParams) -> tuple[list[list[int]], int]:
    before = eng.stats()["preemptions"]
    outs = eng.generate(PROMPTS, params)
    assert_all_blocks_free(eng)
    return [o.token_ids for o in outs], eng.stats()["preemptions"] - before


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family_engines(request, tiny_model_dir):
    """(family, TP 1 reference tokens {greedy, sampled}, a running TP 2 engine)."""
    model_dir = str(tiny_model_dir(request.param))
    with Engine(EngineConfig(model=model_dir, async_batching=False, **TIGHT)) as one:
        reference = {"greedy": run(one, GREEDY)[0], "sampled": run(one, SAMPLED)[0]}
    eng = Engine(EngineConfig(model=model_dir, tensor_parallel_size=2, async_batching=False,
                              **TIGHT))
    pids = eng.tp.worker_pids
    assert len(pids) == 1 and all(alive(p) for p in pids)
    try:
        yield request.param, reference, eng
    finally:
        eng.shutdown()
    assert not any(alive(p) for p in pids), "a worker rank outlived its engine"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tp2_greedy_equals_tp1(family_engines, mode):
    family, reference, eng = family_engines
    assert eng.configure(async_batching=mode == "async")["async_batching"] == (mode == "async")
    tokens, preemptions = run(eng, GREEDY)
    assert preemptions > 0, "the workload was meant to force preemption"
    for i, (got, want) in enumerate(zip(tokens, reference["greedy"], strict=True)):
        assert got == want, f"{family} {mode}: prompt {i} ({len(PROMPTS[i])} tokens) diverged"


def test_tp2_seeded_sampling_equals_tp1(family_engines):
    family, reference, eng = family_engines
    eng.configure(async_batching=True)
    tokens, _ = run(eng, SAMPLED)
    assert tokens == reference["sampled"], f"{family}: seeded sampling differs at TP 2"


def test_settings_say_tp2_and_the_fused_path(family_engines):
    _, _, eng = family_engines
    info = eng.settings()
    assert info["tensor_parallel_size"] == 2 and info["model_impl"] == "gapless"
    # each rank holds its share of the KV heads (the tiny models have 2)
    assert eng.runner.kv_caches[0][0].shape[2] == 1


def test_per_rank_spans_arrive_and_line_up_with_rank0(family_engines):
    family, _, eng = family_engines
    eng.generate(PROMPTS[:4], GREEDY)
    records = eng.bus.snapshot_steps(4096)
    spans = [s for r in records for s in r.spans]
    by_lane: dict[str, list] = {}
    for s in spans:
        by_lane.setdefault(s.lane, []).append(s)
    for lane in (rank_lane(0, "comm"), rank_lane(1, "compute"), rank_lane(1, "comm")):
        assert by_lane.get(lane), f"{family}: no spans on {lane}"
    steps = len(records)
    # a worker's spans arrive when they arrive (never waited for): at most a step or two late
    assert len(by_lane[rank_lane(1, "compute")]) >= steps - 2
    # The ranks meet in every collective, so each worker step overlaps a rank-0 compute span
    # (same host clock across processes).
    rank0 = sorted((s.start_ns, s.end_ns) for s in by_lane["compute"])
    for s in by_lane[rank_lane(1, "compute")]:
        assert s.start_ns <= s.end_ns
        assert any(a <= s.end_ns and s.start_ns <= b for a, b in rank0), (
            f"{family}: rank 1's step at {s.start_ns} overlaps no rank-0 compute span")
    # every collective of a step lies inside that rank's compute span
    comm1 = by_lane[rank_lane(1, "comm")]
    compute1 = by_lane[rank_lane(1, "compute")]
    assert all(any(c.start_ns <= x.start_ns and x.end_ns <= c.end_ns for c in compute1)
               for x in comm1)



def test_a_second_tp_engine_in_the_process_is_refused(family_engines):
    _, _, eng = family_engines
    with pytest.raises(RuntimeError, match="a tensor-parallel engine is already running in this "
                       "process"):
        Engine(EngineConfig(model=eng.config.model, tensor_parallel_size=2, **TIGHT),
               start=False)
