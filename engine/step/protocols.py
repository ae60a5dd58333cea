"""What the step loop shares with the engine around it: its live settings, where a request's
text and end go, the other ranks that follow each step, what the runner needs of a rank's
collectives, and how a failed request reads. (engine/parallel implements the rank contracts;
step/ sits below it and never imports it.)

Owns these small contracts only (engine.step.loop re-exports them); no behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.core.batch import StepMeta
from engine.core.request import Request
from telemetry.records import Span

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)
class LiveSettings:
    async_batching: bool
    num_slots: int
    cuda_graphs: bool


class StepFollowers(Protocol):
    """Other ranks that run every step with this loop (tensor parallelism:
    engine.parallel.leader.TPLeader). Told of each launch, graph capture and slot change in
    order; `spans` returns their telemetry that has arrived (never blocks)."""

    def on_launch(self, step: int, slot: int, meta: StepMeta, bucket: int | None,
                  fn: Callable[[], None]) -> Callable[[], None]: ...
    def on_capture(self, slots: list[int]) -> None: ...
    def on_resize(self, num_slots: int) -> None: ...
    def spans(self) -> list[Span]: ...


class RankComm(Protocol):
    """What the model runner needs of a tensor-parallel rank's collectives
    (engine.parallel.comm.TPComm)."""

    world: int

    def broadcast_inputs(self, buf: torch.Tensor) -> None:
        """Rank 0's step input buffer into every rank's `buf`, on the device."""


class RequestSink:
    """Where a request's text and end go (the engine's handles implement it).

    on_delta runs the request's callback: when that raises, it raises RequestFault, and the
    loop ends that request alone with "error". on_finish never raises."""

    def on_delta(self, req: Request, text: str) -> None: ...
    def on_finish(self, req: Request) -> None: ...


class RequestFault(Exception):
    """Something that belongs to one request failed (its callback, its decoding)."""


def describe(error: BaseException) -> str:
    """The message a request that failed because of `error` carries."""
    return f"{type(error).__name__}: {error}"
