"""The instruments' one observer of the step, and their turns at the profiler.

Owns `Instruments`, the engine.step.protocols.StepObserver the loop and pipeline call: it
hands each call to the kernel sampler, the step anatomy and the sentinel, and arbitrates
between the two that use torch.profiler (one CUPTI subscriber per process: while an anatomy
recording is asked for or running the sampler stays off, and a sample in progress is dropped
when one is asked for). Also owns `SamplePublisher`, through which the loop publishes its
records, so that a kernel sample rides on the record of the step that closed its window.

It never decides what runs, never raises into the loop, and is called on the loop's thread
only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from engine.core.request import Request
from engine.instruments.anatomy import AnatomyRecorder, marked
from engine.instruments.kernel_sampler import KernelSampler
from engine.instruments.sentinel import Sentinel, check_sample_every
from telemetry.bus import TelemetryBus
from telemetry.records import RequestEvent, StepRecord

log = logging.getLogger("gapless.kernels")

# Records held for one sample at most; past this they are published without it (a
# conversion that never ends must not stop the telemetry).
MAX_HELD = 1024


class Instruments:
    """The kernel sampler (``kernels``), the step anatomy (``anatomy``) and the sentinel
    (``sentinel``, None under tensor parallelism) as one StepObserver. ``cuda`` says whether
    the engine's streams are CUDA streams (else host-emulated: work runs on their threads)."""

    def __init__(self, *, cuda: bool, kernels: KernelSampler,
                 sentinel: Sentinel | None = None) -> None:
        self.cuda = cuda
        self.kernels = kernels
        self.anatomy = AnatomyRecorder(cuda=cuda)
        self.sentinel = sentinel
        self._host_range: str | None = None  # the anatomy's range for the step being launched
        self._publisher: SamplePublisher | None = None

    # --------------------------------------------------------------------- observer
    def before_launch(self, step: int) -> AbstractContextManager[None] | None:
        ks, anatomy = self.kernels, self.anatomy
        if ks.armed:
            if not anatomy.active:
                return ks.marked(step) if ks.begin_step(step) else None
            ks.abort()  # one profiler at a time: the anatomy's turn
        if anatomy.active:
            anatomy.warmup = max(anatomy.warmup, ks.warmup)
            name = anatomy.begin_step(step)
            if name is not None and self.cuda:
                # Kernels find their step through the launch calls made inside this range.
                return torch.profiler.record_function(name)
            self._host_range = name  # host streams: the work runs on the stream's thread
        return None

    def around_compute(self, step: int, fn: Callable[[], None]) -> Callable[[], None]:
        name, self._host_range = self._host_range, None
        return fn if name is None else marked(name, fn)

    def after_results(self, step: int) -> None:
        if self.anatomy.active:
            self.anatomy.step_done(step)
        if self.kernels.open:
            self.kernels.step_done(step)
        if self.sentinel is not None:
            self.sentinel.poll()  # reads a finished check, queues the next chunk: no wait

    def finished(self, req: Request) -> None:
        if self.sentinel is not None:
            self.sentinel.offer(req)

    def idle(self) -> bool:
        worked = False
        if self.sentinel is not None and self.sentinel.busy:
            self.sentinel.poll(wait=True)  # the checks may have the device
            worked = True
        else:
            # A sample still open would never see its last step (and would hold the
            # profiler): drop it, on this thread that owns it.
            self.kernels.abort()
        if self._publisher is not None:
            self._publisher.flush()
        return worked

    # ------------------------------------------------------------------- the engine's
    def publisher(self, bus: TelemetryBus) -> SamplePublisher:
        """What the loop publishes to (in front of ``bus``)."""
        self._publisher = SamplePublisher(bus, self.kernels)
        return self._publisher

    def set_sentinel_sample_every(self, value: int) -> None:
        """A live change, at a step boundary: queued checks finish first."""
        check_sample_every(value)
        if self.sentinel is None:
            if value:
                raise ValueError("the sentinel cannot be turned on with tensor_parallel_size > 1")
            return
        self.sentinel.drain()
        self.sentinel.sample_every = value

    @property
    def sentinel_sample_every(self) -> int:
        return 0 if self.sentinel is None else self.sentinel.sample_every

    def drain(self) -> None:
        """Finish the sentinel's queued checks (before a reconfiguration)."""
        if self.sentinel is not None:
            self.sentinel.drain()

    def stats(self) -> dict[str, Any]:
        return {**({} if self.sentinel is None else self.sentinel.stats()),
                **self.kernels.stats()}

    def close(self) -> None:
        """On the loop's thread, as it ends: the profiler is that thread's to stop."""
        self.kernels.close()
        if self._publisher is not None:
            self._publisher.flush(force=True)


class SamplePublisher:
    """The loop's records and events on their way to the bus. Events pass straight through.
    While a stopped kernel sample converts, records are held, from the one of the step that
    closed the sample's window (published after the sampler stopped) on; once the sample is
    ready, or lost, they are published in order, the sample on the first. Only a conversion
    that outlasts MAX_HELD records lets its sample ride on a later record."""

    __slots__ = ("bus", "sampler", "held", "publish_event")

    def __init__(self, bus: TelemetryBus, sampler: KernelSampler) -> None:
        self.bus = bus
        self.sampler = sampler
        self.held: list[StepRecord] = []
        self.publish_event: Callable[[RequestEvent], None] = bus.publish_event

    def publish_step(self, rec: StepRecord) -> None:
        if self.held or self.sampler.converting:
            self.held.append(rec)
            self.flush()
            return
        if self.sampler.ready:  # converted before its record came, or released without it
            rec.kernel_samples = self.sampler.take()
        self.bus.publish_step(rec)

    def flush(self, force: bool = False) -> None:
        """Publish the held records once their sample is ready or lost (at once with
        ``force``, or when too many are held)."""
        if not self.held:
            return
        if self.sampler.converting and not force and len(self.held) < MAX_HELD:
            return
        held, self.held = self.held, []
        if not self.sampler.converting:
            held[0].kernel_samples = self.sampler.take()
        else:
            log.warning("kernel sampler: %d records published without the sample they wait "
                        "for (still converting)", len(held))
        for rec in held:
            self.bus.publish_step(rec)
