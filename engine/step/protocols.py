"""What the step loop shares with the engine around it: its live settings, where a request's
text and end go, the other ranks that follow each step, what the runner needs of a rank's
collectives, the observer that instruments the step, and how a failed request reads.
(engine/parallel implements the rank contracts, engine/instruments the observer; step/ sits
below both and never imports them.)

Owns these small contracts only (engine.step.loop re-exports them); no behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.core.batch import StepMeta
from engine.core.request import Request
from telemetry.records import RequestEvent, Span, StepRecord

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


class StepObserver(Protocol):
    """What watches the step without being part of it (engine.instruments.Instruments: the
    kernel sampler, the step anatomy, the sentinel). Every call comes from the loop's thread,
    between or around one step's phases; none may raise or wait for the device, except
    `idle`, which may wait when there is nothing else to run.

    before_launch: a step is about to be launched; returns a context to launch it inside
    (profiler ranges and brackets) or None. around_compute: the step's compute as it will
    run (on the compute stream's thread where streams are host-emulated). after_results: the
    step's results were read, or its device work failed: its kernels are done. finished: a
    request ended. idle: nothing is scheduled or in flight; returns whether it did work of its
    own (the loop then reports work instead of idling)."""

    def before_launch(self, step: int) -> AbstractContextManager[None] | None: ...
    def around_compute(self, step: int, fn: Callable[[], None]) -> Callable[[], None]: ...
    def after_results(self, step: int) -> None: ...
    def finished(self, req: Request) -> None: ...
    def idle(self) -> bool: ...


class StepPublisher(Protocol):
    """Where the loop publishes its records and request events (telemetry.bus.TelemetryBus,
    or an instrument in front of it that adds to a record before it is published)."""

    def publish_step(self, rec: StepRecord) -> None: ...
    def publish_event(self, ev: RequestEvent) -> None: ...


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
