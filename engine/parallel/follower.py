"""A worker rank: load its shard, then run every step rank 0 launches, in the same order.

Owns the worker process's main (`run_worker`) and `Follower`, its step executor. A worker has
no scheduler and no host input buffers: per step it gets a small Launch message on its pipe
(slot, token and sample counts, graph bucket), and its compute receives the step's inputs from
rank 0 by a device broadcast inside the step (engine.step.runner). Its slots, streams, CUDA
graphs (captured when rank 0 captures, same buckets, same order) and token table mirror rank
0's, so the carry-over stays the same on every rank. Work is queued on the worker's compute
stream (a CUDA stream, or a host thread on the CPU), so the worker reads the next message while
the step runs. Only rank 0 copies tokens to the host.

A worker ends on Stop, and when rank 0 is gone (EOF on its pipe); whatever else fails is sent
to rank 0 as Failed and ends the worker. Never schedules and never emits tokens.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection

import torch

from engine.attention.interface import resolve_backend
from engine.config import EngineConfig
from engine.core.batch import BufferLayout
from engine.core.block_allocator import blocks_needed
from engine.model import loader
from engine.parallel import group
from engine.parallel.comm import TPComm
from engine.parallel.messages import (
    Build,
    Capture,
    Failed,
    Launch,
    Loaded,
    RankSpans,
    Ready,
    Resize,
    Stop,
)
from engine.parallel.shard import build_rank_model
from engine.parallel.timing import RankStep, rank_spans
from engine.step.graphs import GraphCache
from engine.step.runner import DeviceView, ModelRunner
from engine.step.streams import Event, StreamSet, TimedOp

JOIN_TIMEOUT_S = 120.0


def worker_device(config: EngineConfig, rank: int) -> torch.device:
    device = loader.resolve_device(config.device)
    return torch.device("cuda", rank) if device.type == "cuda" else device


def run_worker(rank: int, world: int, port: int, config: EngineConfig, conn: Connection) -> None:
    """The worker process's main (torch.multiprocessing spawn target)."""
    try:
        _serve(rank, world, port, config, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # rank 0 is gone: nothing to report to
    except BaseException as e:
        try:
            conn.send(Failed(rank, f"{type(e).__name__}: {e}"))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        raise SystemExit(1) from e
    finally:
        group.leave()


def _serve(rank: int, world: int, port: int, config: EngineConfig, conn: Connection) -> None:
    device = worker_device(config, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # the ranks share the CPU's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dtype = loader.resolve_dtype(config.dtype, device)
    model, _ = loader.load_model_and_tokenizer(config, torch.device("cpu"), dtype)
    conn.send(Loaded(rank))
    group.join(rank, world, device, JOIN_TIMEOUT_S, port=port)
    build = conn.recv()
    if isinstance(build, Stop):
        return
    assert isinstance(build, Build), build
    vocab = int(model.lm_head.weight.shape[0])
    comm = TPComm(rank, world, vocab, cuda=device.type == "cuda")
    model = build_rank_model(model, comm, build.max_model_len, device)
    _, backend = resolve_backend(config.attention_backend, device)
    runner = ModelRunner(model, backend, device, dtype, build.num_blocks, config.block_size,
                         config.max_num_seqs, build.max_model_len, tp=comm)
    layout = BufferLayout(config.max_num_batched_tokens, config.max_num_seqs,
                          blocks_needed(build.max_model_len, config.block_size))
    follower = Follower(rank, runner, comm, layout, build, conn)
    conn.send(Ready(rank))
    try:
        follower.serve()
    finally:
        follower.close()


class Follower:
    """Runs rank 0's steps on this rank's shard; see the module docstring."""

    def __init__(self, rank: int, runner: ModelRunner, comm: TPComm, layout: BufferLayout,
                 build: Build, conn: Connection) -> None:
        self.rank = rank
        self.runner = runner
        self.comm = comm
        self.layout = layout
        self.conn = conn
        self.telemetry = build.telemetry
        self.streams = StreamSet(runner.device)
        self.pending: deque[tuple[int, TimedOp, RankStep, Event]] = deque()
        self.graphs: GraphCache | None = None
        self.slots: list[DeviceView] = []
        self.resize(build.num_slots)
        if build.graph_buckets is not None and self.streams.is_cuda:
            self.graphs = GraphCache(list(build.graph_buckets), runner.compute,
                                     self.streams.compute.stream,  # type: ignore[attr-defined]
                                     layout.max_seqs, timing=build.telemetry)

    def serve(self) -> None:
        while True:
            self.report()
            if self.pending and not self.conn.poll(0.002):
                continue  # a step is running: look for its end again soon
            msg = self.conn.recv()
            if isinstance(msg, Stop):
                return
            if isinstance(msg, Launch):
                self.launch(msg)
            elif isinstance(msg, Capture):
                self.capture(msg.slots)
            elif isinstance(msg, Resize):
                self.resize(msg.num_slots)
            else:
                raise RuntimeError(f"unexpected message {msg!r}")

    def launch(self, msg: Launch) -> None:
        view = self.slots[msg.slot]
        fn: Callable[[], None]
        if msg.bucket is not None and self.graphs is not None and not self.graphs.failure:
            fn = self.graphs.replay_fn(msg.slot, msg.bucket, msg.greedy_only)
        else:
            runner, t, s, g = self.runner, msg.num_tokens, msg.num_samples, msg.greedy_only

            def fn() -> None:
                with torch.inference_mode():
                    runner.compute(view, t, s, g)

        step = RankStep(fn, self.comm)
        compute = self.streams.compute
        op = compute.timed("compute", step, step.device_events if self.streams.is_cuda else None)
        done = self.streams.event()
        compute.record(done)
        self.pending.append((msg.step, op, step, done))

    def report(self) -> None:
        """Send the spans of the steps that finished (raises what a step raised)."""
        while self.pending and self.pending[0][3].query():
            step_no, op, step, done = self.pending.popleft()
            done.synchronize()  # returns at once; raises the step's error, if any
            if self.telemetry:
                clock = self.streams.clock
                spans = rank_spans(self.rank, step, None if clock is None else clock.to_host_ns,
                                   op.span_ns())
                self.conn.send(RankSpans(self.rank, step_no, tuple(spans)))

    def capture(self, slots: tuple[int, ...]) -> None:
        self._drain()
        if self.graphs is not None:
            with torch.inference_mode():
                self.graphs.capture_all([(i, self.slots[i]) for i in slots])

    def resize(self, num_slots: int) -> None:
        self._drain()
        while len(self.slots) > num_slots:
            self.slots.pop()
        while len(self.slots) < num_slots:
            self.slots.append(DeviceView.allocate(self.layout, self.runner.device))
        if self.graphs is not None:
            self.graphs.drop_slots_from(num_slots)

    def _drain(self) -> None:
        while self.pending:
            self.pending[0][3].synchronize()
            self.report()

    def close(self) -> None:
        try:
            self._drain()
        finally:
            self.streams.close()
