"""Rank 0's side of tensor parallelism: start the ranks, shard, and lead every step.

Owns the start-up order (checks first, so bad settings fail before anything is allocated):

    TPLeader(config, device)    check the GPU count; open the rendezvous store
    shard(model, max_model_len) check the model rank 0 loaded (fused path, heads divisible),
                                spawn the workers (each loads the checkpoint), join the process
                                group, build rank 0's shard, wait for the workers to load
    build(...)                  tell the workers the KV size and settings, wait until ready

and, as the step loop's `followers` (engine.step.loop.StepFollowers), what every step and
settings change tells the workers: a Launch per step (sent before rank 0's own compute is
queued; the step's inputs follow by device broadcast inside the compute), Capture when graphs
are captured, Resize when the slots change. `spans()` hands the loop the per-rank telemetry
(rank 0's collectives, the workers' compute and collectives) that has arrived. Never waits on a
worker in the step loop: a worker's spans arrive when they arrive.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core.batch import StepMeta
from engine.model.hf_config import text_config
from engine.parallel import checks, group
from engine.parallel.comm import TPComm
from engine.parallel.messages import Build, Capture, Launch, Loaded, Ready, Resize
from engine.parallel.shard import build_rank_model
from engine.parallel.timing import RankStep, rank_spans
from engine.parallel.workers import LOAD, WorkerPool
from telemetry.records import Span

START_TIMEOUT_S = 300.0  # loading a large checkpoint in every worker takes a while
JOIN_TIMEOUT_S = 120.0


class TPLeader:
    def __init__(self, config: EngineConfig, device: torch.device,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.world = config.tensor_parallel_size
        self.config = config
        self.device = device
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        checks.check_device_count(self.world, device.type, gpus)
        self.store = group.open_store(self.world, JOIN_TIMEOUT_S)
        self.start_timeout_s = start_timeout_s
        self.pool: WorkerPool | None = None
        self.comm: TPComm | None = None
        self.telemetry = config.telemetry
        self.to_host_ns: Callable[[Any], int] | None = None
        self._steps: deque[tuple[int, RankStep]] = deque()
        self._joined = False

    @property
    def load_device(self) -> torch.device:
        """Where the whole checkpoint is loaded before it is sharded: host memory."""
        return torch.device("cpu")

    def shard(self, model: torch.nn.Module, max_model_len: int) -> torch.nn.Module:
        """Rank 0's shard of `model` (whole, on the CPU) on the engine's device."""
        from engine.model.weights import unsupported_reason

        checks.check_fused(self.world, unsupported_reason(model), self.config.model_impl)
        checks.check_model_shape(self.world, text_config(model.config))
        self.pool = WorkerPool(self.config, self.world, self.store.port, self.start_timeout_s)
        self.pool.wait_all(Loaded, LOAD)
        group.join(0, self.world, self.device, JOIN_TIMEOUT_S, store=self.store)
        self._joined = True
        vocab = int(model.lm_head.weight.shape[0])
        self.comm = TPComm(0, self.world, vocab, cuda=self.device.type == "cuda")
        return build_rank_model(model, self.comm, max_model_len, self.device)

    def build(self, *, num_blocks: int, max_model_len: int, num_slots: int,
              graph_buckets: list[int] | None,
              to_host_ns: Callable[[Any], int] | None) -> None:
        """Workers build their runners with rank 0's sizes; returns once all are ready."""
        self.to_host_ns = to_host_ns
        assert self.pool is not None, "shard() first"
        self.pool.send_all(Build(num_blocks, max_model_len, num_slots,
                                 None if graph_buckets is None else tuple(graph_buckets),
                                 self.telemetry))
        self.pool.wait_all(Ready, "build its runner")

    # ----------------------------------------------------------- the step loop's followers
    def on_launch(self, step: int, slot: int, meta: StepMeta, bucket: int | None,
                  fn: Callable[[], None]) -> Callable[[], None]:
        """Tell the workers to run this step; returns rank 0's compute fn (timed per
        collective when telemetry is on)."""
        # A graph runs the padded step and samples every row; a worker that has to run it
        # eagerly (its capture failed) must use the same shapes in its collectives.
        t, s = meta.num_tokens, meta.num_samples
        if bucket is not None:
            t, s = bucket, self.config.max_num_seqs
        assert self.pool is not None
        self.pool.send_all(Launch(step, slot, t, s, meta.greedy_only, bucket))
        if not self.telemetry:
            return fn
        assert self.comm is not None
        timed = RankStep(fn, self.comm)
        self._steps.append((step, timed))
        return timed

    def on_capture(self, slots: list[int]) -> None:
        assert self.pool is not None
        self.pool.send_all(Capture(tuple(slots)))

    def on_resize(self, num_slots: int) -> None:
        assert self.pool is not None
        self.pool.send_all(Resize(num_slots))

    def spans(self) -> list[Span]:
        """Per-rank spans that have arrived since the last call (never blocks)."""
        out: list[Span] = []
        while self._steps and self._steps[0][1].done():
            _, step = self._steps.popleft()
            out += rank_spans(0, step, self.to_host_ns)
        for msg in self.pool.take_spans() if self.pool is not None else []:
            out += msg.spans
        return out

    @property
    def worker_pids(self) -> list[int]:
        return [] if self.pool is None else self.pool.pids

    def close(self) -> None:
        """End the workers and leave the process group (idempotent)."""
        try:
            if self.pool is not None:
                self.pool.close()
        finally:
            if self._joined:
                group.leave()
                self._joined = False
