"""Generation counters on a slot's buffers: an early slot reuse raises instead of corrupting.

Owns one check. Each buffer of a slot (host input, device input, device output, host output)
records the step whose data it holds and whether that step's reader has finished with it. A
writer `claim`s the buffer for its step: while the last step's reader has not `release`d it,
that raises SlotOverwriteError, naming the slot, the buffer and both steps. A reader checks
that the buffer still holds its own step's data. On host streams the checks run on the stream
threads, around the work itself, so they see the real order of execution; on CUDA the device
buffers are checked in launch order (the streams' event waits order the device), and the host
input, which the CPU writes, is free once the event after its last copy has fired.

Never waits and never orders anything: the pipeline's events do that. This only notices when
they failed to.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.step.streams import Event


class SlotOverwriteError(RuntimeError):
    """A slot buffer was about to be overwritten, or was read, out of step order."""


class BufferGuard:
    __slots__ = ("name", "slot", "generation", "reading")

    def __init__(self, name: str, slot: int) -> None:
        self.name = name
        self.slot = slot
        self.generation = -1  # the step whose data the buffer holds
        self.reading = False  # that step's reader has not finished with it

    def claim(self, step: int, read_done: Event | None = None) -> None:
        """The writer of `step` is about to write. `read_done`: the event after the last
        reader (a finished reader releases the buffer even if nothing told this guard)."""
        if self.reading and read_done is not None and read_done.query():
            self.reading = False
        if self.reading:
            raise SlotOverwriteError(
                f"slot {self.slot} {self.name}: step {step} would overwrite step "
                f"{self.generation}'s data before step {self.generation} has read it")
        self.generation = step
        self.reading = True

    def check(self, step: int) -> None:
        """The reader of `step` reads: the buffer must still hold that step's data."""
        if self.generation != step:
            raise SlotOverwriteError(
                f"slot {self.slot} {self.name}: step {step} reads it, but it holds step "
                f"{self.generation}'s data (overwritten before it was read)")

    def release(self, step: int) -> None:
        """The reader of `step` is done with it."""
        self.check(step)
        self.reading = False


@dataclass(slots=True)
class SlotGuards:
    host_in: BufferGuard
    dev_in: BufferGuard
    dev_out: BufferGuard
    host_out: BufferGuard

    @classmethod
    def for_slot(cls, slot: int) -> SlotGuards:
        return cls(*(BufferGuard(name, slot) for name in
                     ("host input", "device input", "device output", "host output")))

    def reset(self) -> None:
        """After a failed step: its readers may have been skipped, and every launched step of
        the slot has been waited out."""
        for g in (self.host_in, self.dev_in, self.dev_out, self.host_out):
            g.reading = False
