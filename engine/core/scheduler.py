"""Continuous-batching scheduler: which tokens of which requests run in the next step.

Owns the waiting queue, the running set (in admission order), token-table rows and KV block
reservations. Pure Python: it never touches a device, so every decision is testable alone.

Policy: running requests first (in admission order, so decodes and the prefill chunk of the
request admitted last), then waiting requests, FCFS, as prefill chunks filling what is left of
the token budget. When blocks run out, the most recently admitted request is preempted
(its blocks freed, recomputed later). Blocks for a step are reserved when the step is
scheduled, which is one step ahead of its results in async mode.

Prefix caching (when the allocator has it on): a request admitted takes the cached blocks of
the longest prefix of its known tokens (never the last token: it must be computed to give a
logit), counts them as computed, and its first chunk starts after them, charged to the token
budget only for the rest. A request's full blocks are offered to the cache one schedule()
after the step that computes them was scheduled (so no step reads a block that the same step
writes), and again when it is released. When blocks run out and enough are waiting for the
step in flight to complete (deferred frees), a request waits one step instead of preempting.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.block_allocator import BlockAllocator, blocks_needed
from engine.core.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledChunk:
    """Positions [start, start + num_tokens) of one request, computed in one step."""

    request: Request
    start: int
    num_tokens: int
    samples: bool  # the chunk reaches the end of the sequence, so a token is sampled
    table_from: int  # positions >= table_from take their token id from the device table


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    # Tokens of the requests admitted here: looked up in the prefix cache, and found there.
    num_queried_tokens: int = 0
    num_cached_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        # The token budget of each step, read afresh by every schedule(): a live setting
        # (Engine.configure sets it between steps, within engine.config.token_budget_range).
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_rows: list[int] = list(range(max_num_seqs - 1, -1, -1))
        # Per request: first position whose token id lives in its device token-table row.
        self._table_from: dict[str, int] = {}
        self.total_preemptions = 0
        self.prefix_caching = allocator.prefix_caching

    # ----------------------------------------------------------------------------- queue
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def num_free_rows(self) -> int:
        """Token-table rows not held by a running request (max_num_seqs when idle)."""
        return len(self._free_rows)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def finish(self, req: Request, reason: str) -> None:
        """Mark finished and release everything it holds (safe while it is in flight: the
        device runs steps in order, so a later owner of its blocks writes after it)."""
        if req.status is RequestStatus.FINISHED:
            return
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            self._release(req)
        else:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

    # -------------------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: set[str] = set()
        if self.prefix_caching:
            for req in self.running:
                self._offer(req)

        # Running requests: _chunk_len, _reserve and _chunk inlined (the same decisions, each
        # request's lengths read once), as this loop runs over every decoding request at
        # every step.
        running, chunks, table_from = self.running, out.chunks, self._table_from
        bs, max_len = self.block_size, self.max_model_len
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            sampled = len(req.output_token_ids) + req.num_pending
            seq_len = len(req.prompt_token_ids) + sampled
            start = req.num_computed
            remaining = seq_len - start
            if remaining <= 0:
                i += 1
                continue
            n = remaining if remaining < budget else budget
            if n == remaining and not (sampled < req.params.max_tokens and seq_len < max_len):
                # Its last token is already sampled by a step in flight: nothing to compute.
                i += 1
                continue
            if -(-(start + n) // bs) > len(req.block_ids):
                got = self._reserve(req, n, out, scheduled)
                if got is None:  # blocks come free when the step in flight completes
                    i += 1
                    continue
                if not got:  # req itself was preempted (the newest): the list shrank under i
                    continue
            req.num_computed = start + n
            samples = n == remaining
            if samples:
                req.num_pending += 1
            chunks.append(ScheduledChunk(req, start, n, samples, table_from[req.request_id]))
            scheduled.add(req.request_id)
            budget -= n
            i += 1

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self._next_admissible()
            if req is None:
                break
            alloc, seq_len = self.allocator, req.seq_len
            hits, keys, tail = alloc.match(req.known_token_ids(), (seq_len - 1) // self.block_size
                                           ) if self.prefix_caching else ([], [], None)
            cached = len(hits) * self.block_size
            remaining = seq_len - cached
            n = min(remaining, budget)
            if n == remaining and not self._may_sample(req):
                break
            need = blocks_needed(cached + n, self.block_size) - len(hits)
            if need > alloc.num_free - alloc.num_free_among(hits):
                break  # never preempt a running request to admit a new one
            self.waiting.remove(req)
            alloc.take(hits)
            alloc.record_lookup(seq_len, cached)
            req.block_ids = hits + alloc.allocate(need)
            req.block_keys, req.cache_tail = keys, tail
            req.num_computed = cached
            if req.num_preemptions == 0:
                req.num_cached_tokens = cached
            out.num_cached_tokens += cached
            out.num_queried_tokens += seq_len
            req.row = self._free_rows.pop()
            req.status = RequestStatus.RUNNING
            self._table_from[req.request_id] = req.seq_len
            self.running.append(req)
            out.chunks.append(self._chunk(req, n))
            scheduled.add(req.request_id)
            budget -= n

        for c in out.chunks:
            if c.start >= c.table_from:
                out.num_decode_tokens += c.num_tokens
            else:
                out.num_prefill_tokens += c.num_tokens
        return out

    # ------------------------------------------------------------------------- internals
    def _chunk_len(self, req: Request, budget: int) -> int:
        remaining = req.seq_len - req.num_computed
        if remaining <= 0:
            return 0
        n = min(remaining, budget)
        if n == remaining and not self._may_sample(req):
            # Its last token is already sampled by a step in flight (max_tokens or
            # max_model_len reached); nothing more to compute for it.
            return 0
        return n

    def _may_sample(self, req: Request) -> bool:
        return req.num_sampled < req.params.max_tokens and req.seq_len < self.max_model_len

    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        start = req.num_computed
        req.num_computed += n
        samples = req.num_computed == req.seq_len
        if samples:
            req.num_pending += 1
        return ScheduledChunk(req, start, n, samples, self._table_from[req.request_id])

    def _next_admissible(self) -> Request | None:
        for req in self.waiting:
            # A preempted request whose last token is still in flight waits for it: its
            # recompute needs every token id on the host.
            if req.num_pending == 0:
                return req
        return None

    def _reserve(
        self, req: Request, n: int, out: SchedulerOutput, scheduled: set[str]
    ) -> bool | None:
        """True when reserved; None when enough blocks come free once the step in flight
        completes (req skips this step rather than preempt anyone); False when req itself
        was preempted."""
        need = blocks_needed(req.num_computed + n, self.block_size) - len(req.block_ids)
        if need <= 0:
            return True  # most decode steps: the current block still has room
        alloc = self.allocator
        while not alloc.can_allocate(need):
            if alloc.num_free + alloc.num_deferred >= need:
                return None
            victim = self.running[-1]
            assert victim.request_id not in scheduled, "victims are newer than req"
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is req:
                return False
        req.block_ids.extend(alloc.allocate(need))
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.status = RequestStatus.WAITING
        req.num_computed = 0
        req.num_preemptions += 1
        self.total_preemptions += 1
        self.waiting.appendleft(req)

    def _offer(self, req: Request) -> None:
        """Offer req's full blocks, computed (or being computed by a launched step) and with
        known token ids, to the prefix cache."""
        upto = min(req.num_computed, len(req.prompt_token_ids) + len(req.output_token_ids))
        if upto >= (len(req.block_keys) + 1) * self.block_size:
            req.cache_tail = self.allocator.register(
                req.block_ids, req.block_keys, req.cache_tail, req.known_token_ids(), upto)

    def _release(self, req: Request) -> None:
        if self.prefix_caching:
            self._offer(req)
        self.allocator.free(req.block_ids)
        req.block_ids = []
        req.block_keys, req.cache_tail = [], None
        self._free_rows.append(req.row)
        req.row = -1
        self._table_from.pop(req.request_id, None)
