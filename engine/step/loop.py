"""The step loop: schedule, prepare, launch, then read results, in sync or async mode.

    sync : schedule N, prepare N, launch N, wait N, post N
    async: schedule N+1, prepare N+1, launch N+1, wait N, post N

Owns the order of one step's CPU phases and what happens to the tokens that come back
(append, detokenize, stop checks, finish, discard a finished request's one-step-late token;
the text and the stop rule are text.py's).
Live settings change here, at a step boundary, after draining the pipeline. Runs in one
thread (the engine's loop thread, or the caller's in manual stepping).

Where async mode reads a step with nothing launched behind it (a drain, or the one slot about
to be reused), that step's record names why (telemetry.records.SyncFallback); so does how long
the CPU waited for a free slot (slot_wait_ns).

Faults: what one request owns (its decoding, its callbacks) fails that request alone; a
step whose device work fails ends that step's requests; after anything else escaped a step,
`recover()` waits out the launched steps and ends the open requests. Nothing here ends the
thread that runs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.core.batch import BufferLayout, assemble
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.step.graphs import GraphCache
from engine.step.pipeline import InflightStep, Pipeline, Slot
from engine.step.protocols import (  # noqa: F401  (re-exported: the loop's contracts)
    LiveSettings,
    RequestFault,
    RequestSink,
    StepFollowers,
    StepObserver,
    StepPublisher,
    describe,
)
from engine.step.runner import ModelRunner
from engine.step.streams import StreamSet
from engine.step.text import RequestText, stop_reason
from telemetry.records import RequestEvent, Span, StepRecord, SyncFallback
from telemetry.stalls import GRAPH_CAPTURE

log = logging.getLogger("gapless.loop")
now = time.perf_counter_ns


class StepLoop:
    """Construct with keywords only; every argument is shared with the engine."""

    def __init__(
        self,
        *,
        runner: ModelRunner,
        scheduler: Scheduler,
        streams: StreamSet,
        layout: BufferLayout,
        settings: LiveSettings,
        graphs: GraphCache | None,
        graphs_unavailable: str | None,
        bus: StepPublisher | None,
        sink: RequestSink,
        tokenizer: Any,
        eos_ids: set[int],
        followers: StepFollowers | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        self.runner = runner
        self.followers = followers
        self.observer = observer  # the instruments (engine.instruments), told of each step
        # A step's byte floor (ns) from its total context, set by the engine on a GPU
        # (engine.instruments.step_floor.live_floor); None: records carry floor_ns 0.
        self.byte_floor: Callable[[int], int] | None = None
        # Stalls (engine.instruments.stall_watch, set by the engine with telemetry on): judge
        # a record before it is published, told the step launched after it; mark what may
        # stall a step (cause, start ns, end ns, label). None: no verdicts, no marks.
        self.judge_stall: Callable[[StepRecord, StepRecord | None], None] | None = None
        self.mark: Callable[[str, int, int, str], None] | None = None
        self.scheduler = scheduler
        self.streams = streams
        self.settings = settings
        self.graphs = graphs
        self.graphs_unavailable = graphs_unavailable
        self.bus = bus
        self.sink = sink
        self.text = RequestText(tokenizer)
        self.eos_ids = eos_ids
        self.max_model_len = scheduler.max_model_len
        self.block_size = scheduler.block_size
        self.scratch = runner.scratch
        self.pipeline = Pipeline(streams, layout, settings.num_slots, timing=bus is not None,
                                 observer=observer)
        self.inflight: InflightStep | None = None
        self.step_no = 0
        self.discarded_tokens = 0
        self.generated_tokens = 0
        self.delivered_ns = 0  # when the tokens being delivered arrived (one read per step)
        if settings.cuda_graphs:
            self._enable_graphs()

    @property
    def tokenizer(self) -> Any:
        return self.text.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:  # tests swap in a faulty one
        self.text.tokenizer = tokenizer

    # ------------------------------------------------------------------------ requests
    def add(self, req: Request) -> None:
        """Queue a validated request; it is scheduled from the next step on."""
        self.scheduler.add(req)
        self._event(req, "queued")

    def abort(self, req: Request) -> None:
        self.finish(req, "abort")

    def end_all(self, reason: str, error: str | None = None) -> None:
        """Finish every running and waiting request (shutdown, or recovery from a fault)."""
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            if error is not None:
                req.error = error
            self.finish(req, reason)

    def recover(self, error: BaseException) -> None:
        """After an exception escaped step(): wait out every launched step (its tokens are
        discarded), so every slot is free again, then end every open request with "error".
        The loop is then ready to serve, and to be reconfigured."""
        for slot in self.pipeline.slots:
            if slot.inflight is not None:
                step = slot.inflight
                try:
                    self.pipeline.wait_results(step)
                except Exception:  # the step's requests end below anyway
                    pass
                if self.observer is not None:
                    self.observer.after_results(step.step)
        self.inflight = None
        alloc = self.scheduler.allocator
        alloc.complete_all()
        alloc.drop_cache()  # a step that failed half-way may have left blocks half-written
        self.end_all("error", describe(error))

    # ------------------------------------------------------------------------ settings
    @property
    def graphs_active(self) -> bool:
        return self.settings.cuda_graphs and self.graphs is not None and not self.graphs.failure

    def graphs_reason(self) -> str | None:
        if self.graphs_unavailable:
            return self.graphs_unavailable
        return self.graphs.failure if self.graphs is not None else None

    def reconfigure(self, async_batching: bool | None, num_slots: int | None,
                    cuda_graphs: bool | None, max_num_batched_tokens: int | None = None) -> None:
        """Apply new live settings at a step boundary, draining the pipeline first. The
        token budget holds from the next schedule() on (the step buffers and graph buckets
        are sized for the largest budget, so a smaller one needs nothing else)."""
        self.drain(SyncFallback.LIVE_SETTINGS)
        if max_num_batched_tokens is not None:
            self.scheduler.max_num_batched_tokens = max_num_batched_tokens
        if async_batching is not None:
            self.settings.async_batching = async_batching
        if num_slots is not None and num_slots != len(self.pipeline.slots):
            try:
                self.pipeline.resize(num_slots)
            finally:  # a failed allocation leaves the slots it made: say so, honestly
                self.settings.num_slots = len(self.pipeline.slots)
            if self.followers is not None:
                self.followers.on_resize(len(self.pipeline.slots))
            if self.graphs is not None:
                self.graphs.drop_slots_from(num_slots)
            if self.graphs_active:
                self._enable_graphs()
        if cuda_graphs is not None:
            self.settings.cuda_graphs = cuda_graphs
            if cuda_graphs:
                self._enable_graphs()
        self.streams.reanchor()

    def _enable_graphs(self) -> None:
        if self.graphs is None:
            self.settings.cuda_graphs = False
            return
        if self.graphs.failure:
            return
        views = []
        for slot in self.pipeline.slots:
            self._fill_dummy(slot)
            views.append((slot.index, slot.dev))
        if self.followers is not None:
            self.followers.on_capture([index for index, _ in views])
        start = now()
        with torch.inference_mode():
            ok = self.graphs.capture_all(views)
        if self.mark is not None:
            self.mark(GRAPH_CAPTURE, start, now(), f"CUDA graphs captured for {len(views)} slots")
        if not ok:
            self.settings.cuda_graphs = False

    def _fill_dummy(self, slot: Slot) -> None:
        """A padded step of nothing, so graph warm-up and capture read valid indices."""
        top = self.graphs.buckets[-1] if self.graphs else 1
        assemble(SchedulerOutput(), slot.host, self.block_size, self.scratch, pad_to=top)
        slot.dev.buf.copy_(slot.host_buf)
        if self.streams.is_cuda:
            torch.cuda.synchronize()

    # ---------------------------------------------------------------------------- step
    def step(self) -> bool:
        """Run one step boundary. Returns False when there was nothing to do."""
        t0 = now()
        sched = self.scheduler.schedule()
        t1 = now()
        if sched.is_empty:
            if self.inflight is not None:
                self.drain(self._empty_schedule_reason())
                return True
            # Idle: the instruments may have work of their own (then this was no idle round).
            return self.observer.idle() if self.observer is not None else False
        step_no = self.step_no
        self.step_no += 1
        # From here this step holds its requests' blocks: a block released before it has
        # completed is not handed out again until then (the deferred-free guard).
        self.scheduler.allocator.launched(step_no)
        slot = self.pipeline.slot_for(step_no)
        slot_wait_ns = self.pipeline.wait_host_input(slot)
        self.pipeline.claim_host_input(slot, step_no)
        t2 = now()
        bucket = self.graphs.bucket_for(sched.num_tokens) if self.graphs_active else None
        meta = assemble(sched, slot.host, self.block_size, self.scratch, pad_to=bucket)
        t3 = now()
        mode = "async" if self.settings.async_batching else "sync"
        record = StepRecord(
            step=step_no, mode=mode, slot=slot.index, num_requests=len(sched.chunks),
            prefill_tokens=sched.num_prefill_tokens, decode_tokens=sched.num_decode_tokens,
            padded_tokens=meta.padded_tokens, graph_bucket=bucket,
            spans=[Span("cpu.schedule", t0, t1), Span("cpu.prepare", t2, t3)],
            preemptions=len(sched.preempted),
            cached_tokens=sched.num_cached_tokens, queried_tokens=sched.num_queried_tokens,
            token_budget=self.scheduler.max_num_batched_tokens,
        )
        if slot_wait_ns:  # one slot in async mode: the CPU waited for the slot's last copy
            record.slot_wait_ns = slot_wait_ns
        if self.bus is not None:  # for the request ledger: who rode this step, and how far
            record.chunks = [(c.request.request_id, c.num_tokens, c.start + c.num_tokens)
                             for c in sched.chunks]
            if self.byte_floor is not None:
                record.floor_ns = self.byte_floor(sum(c[2] for c in record.chunks))
            if sched.num_prefill_tokens:  # a preempted request's prefill computes it again
                record.recomputed_tokens = sum(
                    c.num_tokens for c in sched.chunks
                    if c.request.num_preemptions and c.start < c.table_from)
        if slot.inflight is not None:
            # One slot in async mode: the slot's last step must be read before reuse.
            self._complete(slot.inflight, SyncFallback.SINGLE_SLOT)
        compute_fn = self._compute_fn(slot, meta.num_tokens, meta.num_samples,
                                      meta.greedy_only, bucket)
        if self.followers is not None:
            compute_fn = self.followers.on_launch(step_no, slot.index, meta, bucket, compute_fn)
        t4 = now()
        step = self.pipeline.launch(slot, sched, meta, record, compute_fn)
        record.spans.append(Span("cpu.launch", t4, now()))
        for chunk in sched.chunks:
            req = chunk.request  # its first chunk starts after its cached prefix
            if chunk.start == req.num_cached_tokens and req.num_preemptions == 0:
                self._event(chunk.request, "scheduled")
        if self.settings.async_batching:
            prev, self.inflight = self.inflight, step
            if prev is not None:
                self._complete(prev)
        else:
            self._complete(step)
        return True

    def drain(self, reason: SyncFallback) -> None:
        """Read the step in flight now, if any; its record names `reason`."""
        if self.inflight is not None:
            step, self.inflight = self.inflight, None
            self._complete(step, reason)

    def _empty_schedule_reason(self) -> SyncFallback:
        """Nothing was scheduled beside the step in flight: a preempted request waiting for
        that step's token, or nothing that could run before its results."""
        if any(req.num_pending for req in self.scheduler.waiting):
            return SyncFallback.PREEMPTION
        return SyncFallback.NOTHING_SCHEDULED

    def _compute_fn(self, slot: Slot, t: int, s: int, greedy: bool,
                    bucket: int | None) -> Callable[[], None]:
        if bucket is not None and self.graphs is not None:
            return self.graphs.replay_fn(slot.index, bucket, greedy)  # carries in-graph timing
        runner, view = self.runner, slot.dev

        def run() -> None:
            with torch.inference_mode():
                runner.compute(view, t, s, greedy)

        return run

    # ------------------------------------------------------------------------- results
    def _complete(self, step: InflightStep, fallback: SyncFallback | None = None) -> None:
        """Read a step's results and publish its record; `fallback`: why async mode read it
        with nothing launched behind it (None: a step read in its mode's order)."""
        if self.inflight is step:
            self.inflight = None
        if fallback is not None:
            step.record.sync_fallback = fallback
        tw = now()
        try:
            tokens = self.pipeline.wait_results(step)
        except Exception as e:
            tp = now()
            self.scheduler.allocator.completed(step.step)
            self._fail(step, e)
        else:
            tp = now()
            self.scheduler.allocator.completed(step.step)
            self.deliver(step.meta.samplers, tokens.tolist())
        rec = step.record
        rec.spans.append(Span("cpu.wait", tw, tp))
        rec.spans.append(Span("cpu.post", tp, now()))
        if self.observer is not None:  # outside the step's spans: the instruments' own time
            self.observer.after_results(step.step)
        if self.bus is not None:
            for op in step.ops:
                start, end = op.span_ns()
                rec.spans.append(Span(op.lane, start, end))
            if self.followers is not None:
                rec.spans += self.followers.spans()
            sch = self.scheduler
            rec.running, rec.waiting = len(sch.running), len(sch.waiting)
            rec.kv_blocks_used = sch.allocator.num_used
            rec.kv_blocks_total = sch.allocator.num_blocks
            if self.judge_stall is not None:
                self.judge_stall(rec, None if self.inflight is None else self.inflight.record)
            self.bus.publish_step(rec)

    def _fail(self, step: InflightStep, error: BaseException) -> None:
        log.error("step %d failed: %s", step.step, error)
        self.scheduler.allocator.drop_cache()  # what it computed cannot be trusted
        msg = describe(error)
        for req in step.meta.samplers:
            req.num_pending -= 1
        for chunk in step.sched.chunks:
            req = chunk.request
            if not req.is_finished:
                req.error = msg
                self.finish(req, "error")

    def deliver(self, samplers: list[Request], tokens: list[int]) -> None:
        """A step's sampled tokens arrived (one per sampling request, in order): append each,
        detokenize, check stops, finish what ended, discard what came one step late. They
        arrived together: one timestamp serves them all."""
        self.delivered_ns = now()
        for req, token in zip(samplers, tokens, strict=True):
            self._on_token(req, token)

    def _on_token(self, req: Request, token: int) -> None:
        t = self.delivered_ns
        req.num_pending -= 1
        if req.is_finished:
            self.discarded_tokens += 1  # computed one step late, after the request ended
            return
        req.output_token_ids.append(token)
        self.generated_tokens += 1
        kind = "tokens"
        if req.first_token_ns is None:
            req.first_token_ns = t
            kind = "first_token"
        if self.bus is not None:  # once per token per request: built positionally, inline
            self.bus.publish_event(RequestEvent(req.request_id, kind, t, 1,  # type: ignore[arg-type]
                                                len(req.prompt_token_ids)))
        try:
            reason = self._emit(req, token)
        except Exception as e:  # its tokenizer or its callback: this request alone fails
            log.warning("request %s failed: %s", req.request_id, describe(e))
            req.error = describe(e)
            reason = "error"
        if reason is not None:
            self.finish(req, reason)

    def _emit(self, req: Request, token: int) -> str | None:
        """Detokenize and hand on the new token's text; returns why the request ends now, or
        None. May raise: whatever it raises belongs to this request only."""
        delta, stop_hit = self.text.push(req, token) if req.params.detokenize else ("", False)
        if delta:
            self.sink.on_delta(req, delta)
        if stop_hit:
            return "stop"
        return stop_reason(req, token, self.eos_ids, self.max_model_len)

    def finish(self, req: Request, reason: str) -> None:
        if req.is_finished:
            return
        rest = self.text.close(req)
        if rest and reason != "error":
            try:
                self.sink.on_delta(req, rest)
            except RequestFault as e:
                req.error, reason = describe(e), "error"
        self.scheduler.finish(req, reason)
        req.finished_ns = now()
        if self.observer is not None:
            self.observer.finished(req)
        if self.bus is not None:
            self.bus.publish_event(RequestEvent(
                req.request_id, "finished", now(), prompt_tokens=req.prompt_len, reason=reason,
                cached_tokens=req.num_cached_tokens, preemptions=req.num_preemptions))
        self.sink.on_finish(req)

    def _event(self, req: Request, kind: str, num_tokens: int = 0,
               reason: str | None = None) -> None:
        if self.bus is not None:
            self.bus.publish_event(RequestEvent(
                req.request_id, kind, now(), num_tokens=num_tokens,  # type: ignore[arg-type]
                prompt_tokens=req.prompt_len, reason=reason,
            ))

    def close(self) -> None:
        try:
            self.drain(SyncFallback.SHUTDOWN)
        finally:
            self.streams.close()
