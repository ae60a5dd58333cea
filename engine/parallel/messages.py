"""The messages between rank 0 and a worker rank, over the worker's pipe.

Owns their shapes only. Rank 0 -> worker: Build (once, after loading), then per step Launch,
and at step boundaries Capture, Resize, Stop. Worker -> rank 0: Loaded, Ready, Failed, and
RankSpans (telemetry, only with telemetry on). A step's inputs never travel here: they are
broadcast on the device by torch.distributed (engine.parallel.comm).
"""

from __future__ import annotations

from dataclasses import dataclass

from telemetry.records import Span


@dataclass(slots=True, frozen=True)
class Loaded:
    """The worker loaded the checkpoint and joins the process group next."""

    rank: int


@dataclass(slots=True, frozen=True)
class Build:
    """What the worker needs to build its runner, decided on rank 0."""

    num_blocks: int
    max_model_len: int
    num_slots: int
    graph_buckets: tuple[int, ...] | None  # None: no CUDA graphs
    telemetry: bool


@dataclass(slots=True, frozen=True)
class Ready:
    rank: int


@dataclass(slots=True, frozen=True)
class Failed:
    rank: int
    reason: str


@dataclass(slots=True, frozen=True)
class Launch:
    """Run one step on the slot's buffers: a graph replay when bucket is set and graphs are
    held, else eagerly over num_tokens tokens."""

    step: int
    slot: int
    num_tokens: int
    num_samples: int
    greedy_only: bool
    bucket: int | None


@dataclass(slots=True, frozen=True)
class Capture:
    """Capture CUDA graphs for these slots, as rank 0 does now (same buckets, same order)."""

    slots: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class Resize:
    num_slots: int


@dataclass(slots=True, frozen=True)
class Stop:
    pass


@dataclass(slots=True, frozen=True)
class RankSpans:
    """One finished step of one rank: its compute span and its collectives' spans."""

    rank: int
    step: int
    spans: tuple[Span, ...]
