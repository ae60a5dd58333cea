"""The collectives of one tensor-parallel rank's forward, and their timing.

Owns `TPComm`: what the sharded fused model calls between its GEMMs (one all-reduce after
the row-parallel o and down projections, the vocabulary-parallel embedding and logits) and
what the runner calls at the start of a step (broadcast of the step's flat input buffer from
rank 0). Every call goes through torch.distributed on the default process group: gloo with CPU
tensors, NCCL with CUDA tensors (queued on the current stream, no host sync, so a CUDA graph
can capture it).

Timing (telemetry): between `begin()` and `end()` each collective is timed, on the host clock
on CPU, by a pair of CUDA events on the current stream on CUDA (not inside a graph capture:
a replayed graph reports no per-collective time). `end()` returns the marks; `resolve` turns
them into host-clock intervals once the step is known to be done.

Never decides what runs, never syncs with the host on CUDA, and never allocates per-value
(the logits gather allocates per step, as the unsharded LM head does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

Mark = tuple[Any, Any]  # (start, end): host ns on CPU, CUDA events on CUDA


class TPComm:
    """The collectives of rank `rank` of `world`; `vocab_size` is the real (unpadded) vocab,
    each rank holds rows [vocab_start, vocab_start + vocab_per_rank) of the padded one."""

    def __init__(self, rank: int, world: int, vocab_size: int, cuda: bool) -> None:
        self.rank = rank
        self.world = world
        self.vocab_size = vocab_size
        self.vocab_per_rank = -(-vocab_size // world)
        self.vocab_start = rank * self.vocab_per_rank
        self.cuda = cuda
        self._marks: list[Mark] | None = None

    # ------------------------------------------------------------------------ collectives
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks (in place; returns x)."""
        with self._timed():
            dist.all_reduce(x)
        return x

    def embed(self, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary-parallel embedding: each rank looks up the ids in its rows (zeros for
        the others), then one all-reduce sums the ranks' partial rows."""
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_per_rank)
        x = F.embedding(torch.where(mine, local, torch.zeros_like(local)), weight)
        x = x * mine[:, None].to(x.dtype)
        return self.all_reduce(x)

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """[S, vocab_per_rank] of every rank -> [S, vocab_size] on every rank (the padded
        columns of the last rank are cut off), so every rank samples the same tokens."""
        parts = [torch.empty_like(local) for _ in range(self.world)]
        with self._timed():
            dist.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]

    def broadcast_inputs(self, buf: torch.Tensor) -> None:
        """Rank 0's step input buffer (already on its device) into every rank's `buf`."""
        with self._timed():
            dist.broadcast(buf, src=0)

    # ----------------------------------------------------------------------------- timing
    def begin(self) -> None:
        self._marks = []

    def end(self) -> list[Mark]:
        marks, self._marks = self._marks or [], None
        return marks

    def _timed(self) -> _Timer:
        return _Timer(self._marks if self._marks is not None and not _capturing() else None,
                      self.cuda)

    @staticmethod
    def resolve(marks: list[Mark], to_host_ns: Callable[[Any], int] | None
                ) -> list[tuple[int, int]]:
        """Host-clock (start, end) of each mark; CUDA marks need the stream clock's mapping
        and a finished step."""
        if to_host_ns is None:
            return [(int(a), int(b)) for a, b in marks]
        return [(to_host_ns(a), to_host_ns(b)) for a, b in marks]


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class _Timer:
    __slots__ = ("marks", "cuda", "start")

    def __init__(self, marks: list[Mark] | None, cuda: bool) -> None:
        self.marks = marks
        self.cuda = cuda
        self.start: Any = None

    def __enter__(self) -> None:
        if self.marks is None:
            return
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        if self.marks is None:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            end = time.perf_counter_ns()
        self.marks.append((self.start, end))
