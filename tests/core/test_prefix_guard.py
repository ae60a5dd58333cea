"""Eviction under memory pressure never hands out a block that a running request or a launched,
not yet completed step uses: the deferred-free guard, with a negative control that removes it.

A watcher snapshots, at each launch, every block the running requests hold (the step reads or
writes those), forgets the snapshot when the step completes, and checks every allocation
against the snapshots still open. Async batching with a cache too small for the workload
forces preemption, eviction of cached blocks and reuse of freed ones while a step is in flight.
"""

from __future__ import annotations

import pytest
from engine_checks import assert_all_blocks_free
from test_prefix_cache import GREEDY, TIGHT, shared_prefix_prompts

from engine import Engine, EngineConfig
from engine.core.block_allocator import BlockAllocator


class InFlightWatch:
    """Wraps one allocator's launched / completed / allocate; `guard=False` removes the
    deferred-free guard (the allocator is never told a step was launched)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch, guard: bool) -> None:
        alloc: BlockAllocator = engine.scheduler.allocator
        running = engine.scheduler.running
        self.open: dict[int, set[int]] = {}
        self.violations: list[tuple[int, set[int]]] = []
        self.allocations = 0
        launched, completed, allocate = alloc.launched, alloc.completed, alloc.allocate

        def on_launched(step: int) -> None:
            self.open[step] = {b for r in running for b in r.block_ids}
            if guard:
                launched(step)

        def on_completed(step: int) -> None:
            for s in [s for s in self.open if s <= step]:
                del self.open[s]
            completed(step)

        def on_allocate(n: int) -> list[int]:
            got = allocate(n)
            self.allocations += 1
            for step, used in self.open.items():
                if used.intersection(got):
                    self.violations.append((step, used.intersection(got)))
            return got

        monkeypatch.setattr(alloc, "launched", on_launched)
        monkeypatch.setattr(alloc, "completed", on_completed)
        monkeypatch.setattr(alloc, "allocate", on_allocate)


def run_watched(model_dir, monkeypatch, guard: bool):
    prompts = shared_prefix_prompts(8, seed=3) + shared_prefix_prompts(6, prefix_len=21, seed=4)
    cfg = EngineConfig(model=str(model_dir), **{**TIGHT, "async_batching": True,
                                                "num_slots": 2, "prefix_caching": True})
    with Engine(cfg, start=False) as eng:
        watch = InFlightWatch(eng, monkeypatch, guard)
        outs = [[o.token_ids for o in eng.generate(prompts, GREEDY)] for _ in range(2)]
        stats = eng.stats()
        if guard:
            assert_all_blocks_free(eng)
    return watch, outs, stats


def test_no_block_in_use_by_a_launched_step_is_handed_out(tiny_model_dir, monkeypatch):
    watch, outs, stats = run_watched(tiny_model_dir("llama"), monkeypatch, guard=True)
    assert stats["preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    assert watch.allocations > 50
    assert watch.violations == []
    assert outs[0] == outs[1]


def test_negative_control_without_the_guard_the_watch_sees_reuse(tiny_model_dir, monkeypatch):
    """The same run with the guard removed: blocks of a request that finished or was
    preempted are handed out while a step that uses them is still in flight."""
    watch, _, _ = run_watched(tiny_model_dir("llama"), monkeypatch, guard=False)
    assert watch.violations, "the watch must catch reuse when the guard is off"
