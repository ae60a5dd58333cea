"""The scheduler's inlined loop over running requests decides exactly what the plain one
(kept here as the reference: _chunk_len, _reserve, _chunk per request) decides, step by step,
on random workloads with chunked prefill, preemption, max_tokens and max_model_len limits,
and results that arrive one step late."""

from __future__ import annotations

import random

import pytest
import torch
from test_scheduler import loop_for, make, post, req

from engine.core.block_allocator import blocks_needed
from engine.core.request import RequestStatus
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.step.streams import StreamSet


class ReferenceScheduler(Scheduler):
    """schedule() as it was before the running loop was inlined."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: set[str] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = self._chunk_len(r, budget)
            if n == 0:
                i += 1
                continue
            if not self._reserve(r, n, out, scheduled):
                continue
            out.chunks.append(self._chunk(r, n))
            scheduled.add(r.request_id)
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            r = self._next_admissible()
            if r is None:
                break
            n = self._chunk_len(r, budget)
            if n == 0:
                break
            need = blocks_needed(r.num_computed + n, self.block_size) - len(r.block_ids)
            if not self.allocator.can_allocate(need):
                break
            self.waiting.remove(r)
            r.block_ids.extend(self.allocator.allocate(need))
            r.row = self._free_rows.pop()
            r.status = RequestStatus.RUNNING
            self._table_from[r.request_id] = r.seq_len
            self.running.append(r)
            out.chunks.append(self._chunk(r, n))
            scheduled.add(r.request_id)
            budget -= n
        for c in out.chunks:
            if c.start >= c.table_from:
                out.num_decode_tokens += c.num_tokens
            else:
                out.num_prefill_tokens += c.num_tokens
        return out


@pytest.fixture(scope="module")
def streams():
    s = StreamSet(torch.device("cpu"))
    yield s
    s.close()


def decisions(out: SchedulerOutput) -> tuple:
    return (
        [
            (c.request.request_id, c.start, c.num_tokens, c.samples, c.table_from)
            for c in out.chunks
        ],
        [r.request_id for r in out.preempted],
        out.num_prefill_tokens,
        out.num_decode_tokens,
    )


def run(cls: type[Scheduler], seed: int, streams: StreamSet) -> list[tuple]:
    rng = random.Random(seed)
    block_size, max_len = rng.choice([2, 4, 8]), rng.randint(24, 48)
    one = blocks_needed(max_len, block_size)  # blocks for one request at its longest
    base = make(
        num_blocks=rng.randint(one, 3 * one),
        block_size=block_size,
        seqs=rng.randint(1, 8),
        budget=rng.randint(1, 32),
        max_len=max_len,
    )
    s = cls(
        base.allocator,
        base.block_size,
        base.max_num_seqs,
        base.max_num_batched_tokens,
        base.max_model_len,
    )
    loop = loop_for(s, streams)
    pending = [req(f"{seed}-{i}", rng.randint(1, 20), rng.randint(1, 30)) for i in range(14)]
    late = rng.random() < 0.7  # async: a step's results arrive after the next is scheduled
    trace, inflight = [], None
    for _ in range(3000):
        if pending and rng.random() < 0.3:
            s.add(pending.pop())
        out = s.schedule()
        trace.append(decisions(out))
        if late:
            if inflight is not None:
                post(loop, inflight, token=rng.randrange(50))
            inflight = out if not out.is_empty else None
        elif not out.is_empty:
            post(loop, out, token=rng.randrange(50))
        if not pending and not s.num_unfinished and inflight is None:
            break
    assert not s.num_unfinished, "a request got stuck"
    return trace


def test_the_inlined_running_loop_decides_as_the_reference_does(streams):
    preempted = 0
    for seed in range(60):
        fast, ref = run(Scheduler, seed, streams), run(ReferenceScheduler, seed, streams)
        assert fast == ref, f"seed {seed}: the schedules differ"
        preempted += sum(len(step[1]) for step in ref)
    assert preempted > 0, "the workloads must exercise preemption"
