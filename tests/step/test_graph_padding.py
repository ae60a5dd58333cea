"""The CUDA-graph path, checked on a CPU: steps padded up to a bucket (`assemble(...,
pad_to=...)`) and graphs of removed slots dropped and captured afresh. A stand-in graph whose
replay runs the runner's compute on the slot it was captured for has the semantics of a CUDA
graph (fixed token count, every sample row, static per-slot buffers), so the engine's own
graph code path runs here; the CUDA tests check the real capture on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
from engine_checks import assert_all_blocks_free, hf_greedy, mixed_prompts

from engine import Engine, EngineConfig, SamplingParams
from engine.core.batch import BufferLayout, HostView, assemble
from engine.core.block_allocator import BlockAllocator
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.scratch import PAD_ROW, Scratch
from engine.step.graphs import GraphCache

GREEDY = dict(temperature=0.0, ignore_eos=True)


def test_padding_points_every_extra_token_and_sample_row_at_scratch():
    sch = Scheduler(BlockAllocator(32), 4, 4, 64, 64)
    for i, n in enumerate((5, 1, 3)):
        sch.add(Request(f"r{i}", list(range(1, n + 1)),
                        SamplingParams(max_tokens=4, temperature=0.5, top_p=0.9), 7, 0))
    out = sch.schedule()
    layout = BufferLayout(64, 4, 16)
    plain = HostView(np.zeros(layout.size, np.int32), layout)
    padded = HostView(np.zeros(layout.size, np.int32), layout)
    scratch = Scratch(kv_slot=31 * 4)
    m0 = assemble(out, plain, 4, scratch)
    m1 = assemble(out, padded, 4, scratch, pad_to=16)
    assert (m0.num_tokens, m0.num_samples, m0.padded_tokens) == (9, 3, 0)
    assert (m1.num_tokens, m1.num_samples, m1.padded_tokens) == (9, 3, 7)
    t, s = 9, 3
    for name in ("ids", "from_table", "positions", "slot_mapping", "token_req"):
        assert (getattr(padded, name)[:t] == getattr(plain, name)[:t]).all(), name
    assert (padded.token_req[t:16] == PAD_ROW).all()  # attention: padding, reads nothing
    assert (padded.slot_mapping[t:16] == scratch.kv_slot).all()  # K/V written to scratch
    assert (padded.from_table[t:16] == 0).all() and (padded.ids[t:16] == 0).all()
    for name in ("sample_idx", "sample_row", "sample_pos", "top_k", "seed", "temperature",
                 "top_p"):
        assert (getattr(padded, name)[:s] == getattr(plain, name)[:s]).all(), name
    assert (padded.sample_row[s:] == scratch.table_row).all()
    assert (padded.temperature[s:] == 0).all() and (padded.top_p[s:] == 1).all()
    assert padded.temperature[0] == np.float32(0.5) and padded.top_p[0] == np.float32(0.9)
    # A step as large as its bucket needs no padding tokens.
    assert assemble(out, padded, 4, scratch, pad_to=9).padded_tokens == 0


class EagerGraph:
    """Replays like a CUDA graph: the same compute on the same static buffers."""

    def __init__(self, cache: GraphCache, view, bucket: int, greedy: bool) -> None:
        self.view, self.bucket, self.greedy, self.cache = view, bucket, greedy, cache

    def replay(self) -> None:
        self.cache._compute(self.view, self.bucket, self.cache._max_samples, self.greedy)


class EagerGraphCache(GraphCache):
    def _capture(self, view, bucket, greedy):
        return EagerGraph(self, view, bucket, greedy)


def graph_engine(model_dir, **kw) -> Engine:
    eng = Engine(EngineConfig(model=str(model_dir), device="cpu", max_num_seqs=4,
                              max_num_batched_tokens=16, block_size=4, num_blocks=40,
                              max_model_len=64, cuda_graphs=False, **kw), start=False)
    eng.loop.graphs = EagerGraphCache([1, 2, 4, 8, 16], eng.runner.compute, None, 4)
    eng.loop.graphs_unavailable = None
    return eng


def drive(eng: Engine) -> None:
    for _ in range(3000):
        if not eng.step() and not eng.scheduler.num_unfinished and eng.loop.inflight is None:
            return
    raise AssertionError("workload did not finish")


@pytest.fixture(scope="module")
def workload(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    prompts = mixed_prompts(6, seed=11)
    prompts = [p[:40] for p in prompts]
    return model_dir, prompts, hf_greedy(model_dir, prompts, 8)


@pytest.mark.parametrize("async_batching", [False, True])
def test_padded_graph_steps_give_the_greedy_tokens(workload, async_batching):
    model_dir, prompts, expected = workload
    eng = graph_engine(model_dir, async_batching=async_batching)
    reader = eng.bus.reader()
    assert eng.configure(cuda_graphs=True)["cuda_graphs"] is True
    hs = [eng.submit(p, SamplingParams(max_tokens=8, **GREEDY)) for p in prompts]
    drive(eng)
    assert [h.result(1).token_ids for h in hs] == expected
    recs = reader.steps()
    assert all(r.graph_bucket is not None for r in recs)
    assert any(r.padded_tokens > 0 for r in recs), "no step was padded"
    assert_all_blocks_free(eng)
    eng.shutdown()


def test_removed_slots_lose_their_graphs_and_new_ones_are_captured_afresh(workload):
    model_dir, prompts, expected = workload
    eng = graph_engine(model_dir, async_batching=True, num_slots=3)
    graphs = eng.loop.graphs
    eng.configure(cuda_graphs=True)
    assert {k[0] for k in graphs.captured()} == {0, 1, 2}
    old_slot1 = graphs._graphs[(1, 4, True)]
    eng.configure(num_slots=1)
    assert {k[0] for k in graphs.captured()} == {0}
    with pytest.raises(KeyError):
        graphs.replay(1, 4, True)
    eng.configure(num_slots=2)
    assert {k[0] for k in graphs.captured()} == {0, 1}
    new_slot1 = graphs._graphs[(1, 4, True)]
    assert new_slot1 is not old_slot1
    assert new_slot1.view is eng.loop.pipeline.slots[1].dev  # the new slot's buffers
    assert old_slot1.view is not new_slot1.view
    hs = [eng.submit(p, SamplingParams(max_tokens=8, **GREEDY)) for p in prompts]
    drive(eng)
    assert [h.result(1).token_ids for h in hs] == expected
    assert_all_blocks_free(eng)
    eng.shutdown()
