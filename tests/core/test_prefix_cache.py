"""Prefix caching: the allocator's cache and guard, the scheduler's accounting, and greedy
output identical with caching on and off (sync, async, chunked prefill, forced preemption,
shared prefixes in flight together, an abort in the middle of a shared prefix's prefill)."""

from __future__ import annotations

import pytest
import torch
from engine_checks import assert_all_blocks_free

from engine import Engine, EngineConfig, SamplingParams
from engine.core.block_allocator import BlockAllocator
from engine.core.request import Request
from engine.core.scheduler import Scheduler

MAX_NEW = 10
# Chunked prefill (16-token budget) and preemption (24 usable blocks of 4 tokens for 8
# requests of up to ~60 tokens).
TIGHT = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
             num_blocks=25, max_model_len=96)
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


def shared_prefix_prompts(n: int = 8, prefix_len: int = 30, seed: int = 0) -> list[list[int]]:
    """n prompts: one common prefix (not block-aligned), then 1 to ~20 tokens of their own;
    two of them identical, one equal to the prefix alone."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(1, 300, (prefix_len,), generator=g).tolist()
    out = [prefix + torch.randint(1, 300, (1 + 3 * i,), generator=g).tolist()
           for i in range(n - 2)]
    return out + [list(out[1]), list(prefix)]


# ------------------------------------------------------------------------- allocator
def _filled(alloc: BlockAllocator, tokens: list[int]) -> tuple[list[int], list[int]]:
    blocks = alloc.allocate(-(-len(tokens) // alloc.block_size))
    keys: list[int] = []
    alloc.register(blocks, keys, None, tokens, len(tokens))
    return blocks, keys


def test_a_hit_needs_the_same_tokens_and_the_same_parent():
    alloc = BlockAllocator(8, block_size=4, prefix_caching=True)
    a = list(range(1, 13))
    blocks, _ = _filled(alloc, a)
    assert alloc.match(a, 3)[0] == blocks
    assert alloc.match(a[:8] + [99, 10, 11, 12], 3)[0] == blocks[:2]  # diverges in block 2
    assert alloc.match([0] + a[1:], 3)[0] == []  # block 0 differs: nothing after it counts
    assert alloc.match(a, 2)[0] == blocks[:2]  # never more than asked


def test_a_hash_collision_is_a_miss_not_a_hit():
    alloc = BlockAllocator(8, block_size=4, prefix_caching=True)
    blocks, _ = _filled(alloc, [1, 2, 3, 4])
    other = [5, 6, 7, 8]
    key = hash((None, tuple(other), alloc.extra_key))
    alloc._by_key[key] = blocks[0]  # as if `other` hashed like [1, 2, 3, 4]
    assert alloc.match(other, 1)[0] == []


def test_unreferenced_cached_blocks_stay_until_needed_then_go_least_recently_used_first():
    alloc = BlockAllocator(4, block_size=2, prefix_caching=True)
    old, _ = _filled(alloc, [1, 2, 3, 4])
    alloc.free(old)
    new, _ = _filled(alloc, [5, 6])
    alloc.free(new)
    assert alloc.num_free == 4 and alloc.num_cached == 3
    fresh = alloc.allocate(1)  # the never-cached block goes first
    assert fresh[0] not in old + new and alloc.num_cached == 3
    alloc.free(fresh)
    alloc.allocate(2)  # the never-cached block, then the oldest cached: [1, 2, 3, 4]'s tail
    assert alloc.match([1, 2, 3, 4, 0], 2)[0] == old[:1]
    assert alloc.match([5, 6, 0], 1)[0] == new


def test_a_block_released_while_a_step_is_in_flight_waits_for_that_step():
    alloc = BlockAllocator(2, block_size=2, prefix_caching=True)
    blocks, _ = _filled(alloc, [1, 2, 3])
    alloc.launched(7)
    alloc.free(blocks)
    assert alloc.num_free == 0 and alloc.num_deferred == 2 and not alloc.can_allocate(1)
    hit, _, _ = alloc.match([1, 2, 3], 1)  # a hit only reads it: allowed meanwhile
    alloc.take(hit)
    assert alloc.num_deferred == 1 and alloc.num_used == 1
    alloc.completed(6)
    assert alloc.num_free == 0
    alloc.completed(7)
    assert alloc.num_free == 1 and alloc.num_deferred == 0
    alloc.free(hit)  # nothing in flight now: at once
    assert alloc.num_free == 2


# ------------------------------------------------------------------------- scheduler
def _run_to_end(sch: Scheduler, req: Request) -> None:
    sch.add(req)
    while not req.is_finished:
        out = sch.schedule()
        assert not out.is_empty
        for c in out.chunks:
            if c.samples:
                c.request.num_pending -= 1
                c.request.output_token_ids.append(1)
                if len(c.request.output_token_ids) >= c.request.params.max_tokens:
                    sch.finish(c.request, "length")


def test_cached_tokens_count_as_computed_and_the_last_token_is_always_computed():
    alloc = BlockAllocator(32, block_size=4, prefix_caching=True)
    sch = Scheduler(alloc, 4, 4, 64, 128)
    params = SamplingParams(max_tokens=1, detokenize=False)
    prompt = list(range(1, 21))  # 5 full blocks
    _run_to_end(sch, Request("a", prompt, params, 0, 0))
    longer = Request("b", prompt + [7, 8, 9], params, 0, 0)
    sch.add(longer)
    out = sch.schedule()
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(20, 3)]
    assert out.num_prefill_tokens == 3 and out.num_cached_tokens == 20
    assert longer.num_cached_tokens == 20
    same = Request("c", list(prompt), params, 0, 0)
    sch.add(same)
    out = sch.schedule()
    # 20 tokens cached, but the last must run to give a logit: 4 blocks hit, one recomputed.
    assert [(c.start, c.num_tokens) for c in out.chunks if c.request is same] == [(16, 4)]
    assert alloc.hits == 36 and alloc.queries == 20 + 23 + 20


def test_caching_off_never_hits():
    alloc = BlockAllocator(32, block_size=4)
    sch = Scheduler(alloc, 4, 4, 64, 128)
    params = SamplingParams(max_tokens=1, detokenize=False)
    _run_to_end(sch, Request("a", list(range(1, 21)), params, 0, 0))
    sch.add(Request("b", list(range(1, 21)), params, 0, 0))
    assert sch.schedule().num_prefill_tokens == 20 and alloc.num_cached == 0


# ------------------------------------------------------------------------- engine
def run_engine(model_dir, prompts, rounds: int = 2, **settings):
    """Greedy tokens of `prompts`, `rounds` times over (later rounds hit what earlier ones
    left), with the engine's stats."""
    with Engine(EngineConfig(model=str(model_dir), **{**TIGHT, **settings})) as eng:
        outs = [[o.token_ids for o in eng.generate(prompts, GREEDY)] for _ in range(rounds)]
        stats = eng.stats()
        assert_all_blocks_free(eng)
    return outs, stats


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("async_batching", [False, True])
def test_greedy_output_is_the_same_with_caching_on_and_off(tiny_model_dir, family,
                                                           async_batching):
    model_dir = tiny_model_dir(family)
    prompts = shared_prefix_prompts()
    off, off_stats = run_engine(model_dir, prompts, prefix_caching=False,
                                async_batching=async_batching)
    on, on_stats = run_engine(model_dir, prompts, prefix_caching=True,
                              async_batching=async_batching)
    assert on == off
    assert off[0] == off[1]
    assert off_stats["prefix_cache_hits"] == 0
    assert on_stats["prefix_cache_hits"] > 0, "the shared prefix was meant to hit"
    assert on_stats["preemptions"] > 0, "the workload was meant to force preemption"


def test_two_requests_sharing_a_prefix_at_once_with_room_to_spare(tiny_model_dir):
    """No preemption: the second of two identical long prompts, arriving a step later, hits
    the blocks the first is still computing (launched, not yet completed)."""
    model_dir = tiny_model_dir("llama")
    prompt = shared_prefix_prompts()[5]
    outs = {}
    for caching in (False, True):
        cfg = EngineConfig(model=str(model_dir), **{**TIGHT, "num_blocks": 64,
                                                    "prefix_caching": caching})
        with Engine(cfg, start=False) as eng:
            first = eng.submit(prompt, GREEDY)
            eng.step()
            eng.step()
            second = eng.submit(prompt, GREEDY)
            while not (first.done and second.done):
                eng.step()
            outs[caching] = [first.result(), second.result()]
            assert eng.stats()["preemptions"] == 0
            assert_all_blocks_free(eng)
    assert [o.token_ids for o in outs[True]] == [o.token_ids for o in outs[False]]
    assert outs[True][1].num_cached_tokens > 0 and outs[False][1].num_cached_tokens == 0


def test_an_abort_in_the_middle_of_a_shared_prefix_prefill(tiny_model_dir):
    model_dir = tiny_model_dir("qwen2")
    prompts = shared_prefix_prompts()
    outs = {}
    for caching in (False, True):
        cfg = EngineConfig(model=str(model_dir), **{**TIGHT, "prefix_caching": caching})
        with Engine(cfg, start=False) as eng:
            doomed = eng.submit(prompts[4], GREEDY)
            eng.step()  # 16 of its ~43 tokens launched, the step still in flight (async)
            eng.step()
            eng.abort(doomed.request_id)
            later = eng.submit(prompts[2], GREEDY)
            while not later.done:
                eng.step()
            assert doomed.result().finish_reason == "abort"
            outs[caching] = later.result()
            assert_all_blocks_free(eng)
    assert outs[True].token_ids == outs[False].token_ids
    assert outs[True].num_cached_tokens >= 16
