"""Value types that cross the telemetry bus: spans, step records and request events.

Owns the record shapes only. It must never import anything of ours (engine/, ui/) or any
UI library: telemetry/ is the bottom of the dependency graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

# Lanes of the timeline, in the order a dashboard draws them (top to bottom).
CPU_LANES: tuple[str, ...] = ("cpu.schedule", "cpu.prepare", "cpu.launch", "cpu.wait", "cpu.post")
# "compute" runs from a step's first kernel to its last where the engine can see kernels (a
# CUDA graph carries timing events inside it); "compute.launch" is the stretch before it,
# from the compute stream reaching the step to that first kernel (graph launch latency).
DEVICE_LANES: tuple[str, ...] = ("h2d", "compute.launch", "compute", "d2h")
LANES: tuple[str, ...] = CPU_LANES + DEVICE_LANES
# Tensor parallelism adds lanes per rank: "rank1.compute" (a worker rank's step, as its device
# ran it) and "rank0.comm", "rank1.comm", ... (time inside the step's collectives: all-reduces,
# the input broadcast, the logits gather). Rank 0's compute is the "compute" lane. A straggler
# rank shows as a longer compute span while the other ranks' comm spans grow (they wait for it).
RANK_LANE_KINDS: tuple[str, ...] = ("compute", "comm")


def rank_lane(rank: int, kind: str) -> str:
    """The lane of one tensor-parallel rank's `kind` ("compute" or "comm")."""
    return f"rank{rank}.{kind}"


def rank_lanes(world: int) -> tuple[str, ...]:
    """Every per-rank lane of `world` ranks, in drawing order (rank 0's compute is "compute")."""
    out = [rank_lane(0, "comm")]
    for r in range(1, world):
        out += [rank_lane(r, "compute"), rank_lane(r, "comm")]
    return tuple(out)

Mode = Literal["sync", "async"]


class SyncFallback(StrEnum):
    """Why the async pipeline read a step's results with no later step launched behind it
    (the device then idles from that step's end until the CPU launches again). Sync mode
    reads every step that way by design: its records say so by their mode and carry None."""

    SINGLE_SLOT = "single slot"  # the only slot: read before the next step may reuse it
    NOTHING_SCHEDULED = "nothing scheduled"  # nothing could run before its results were in
    PREEMPTION = "preemption"  # what is left waits for a preempted request's token in flight
    LIVE_SETTINGS = "live settings"  # a live-settings change drains the pipeline first
    SHUTDOWN = "shutdown"  # the engine stops: the step in flight is read, then the streams end


# Span and RequestEvent are made many times a step on the engine's loop thread: plain slotted
# dataclasses, as a frozen dataclass's __init__ costs about three times as much (it sets each
# field through object.__setattr__). Treat them as immutable once published all the same.
@dataclass(slots=True)
class Span:
    """One interval of work on one lane, in host-clock nanoseconds (time.perf_counter_ns)."""

    lane: str
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class StepRecord:
    """Everything one engine step publishes: its facts and its spans.

    graph_bucket is the token-count bucket of the CUDA graph that ran the step, or None when
    the step ran eagerly. padded_tokens counts the tokens added to reach that bucket.
    """

    step: int
    mode: Mode
    slot: int
    num_requests: int
    prefill_tokens: int
    decode_tokens: int
    padded_tokens: int = 0
    graph_bucket: int | None = None
    spans: list[Span] = field(default_factory=list)
    # Engine-wide gauges sampled at the end of the step.
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    preemptions: int = 0  # preemptions made while scheduling this step
    recomputed_tokens: int = 0  # prefill tokens that recompute what a preemption dropped
    # Prefix cache: tokens of the requests admitted in this step, looked up and found cached
    # (their prefill starts after the cached ones).
    queried_tokens: int = 0
    cached_tokens: int = 0
    # A stall (telemetry/stalls.py): its cause ("" when the step is none), the step's interval
    # (from the end of the step before it to its own end), the median interval of recent steps
    # of its kind, and what named the cause. Empty in recordings made before steps had them.
    stall: str = ""
    stall_ns: int = 0
    stall_baseline_ns: int = 0
    stall_detail: str = ""
    # (request id, tokens it computed in this step, its context length after them): which
    # requests rode the step, for the request ledger. Empty when telemetry is off.
    chunks: list[tuple[str, int, int]] = field(default_factory=list)
    # Measured kernels (telemetry.kernels.KernelSample) of the sampled steps whose window
    # this step closed: a kernel sample rides on that step's record.
    kernel_samples: list[Any] = field(default_factory=list)
    # The step's byte floor, ns: the weights it reads once and its requests' KV over their
    # contexts, at the peak copy bandwidth the engine measured at start (the waterfall's
    # "byte floor" part); 0 where unknown (a CPU, telemetry off, a recording made before it).
    floor_ns: int = 0
    # The token budget (max_num_batched_tokens, a live setting) this step was scheduled
    # under; 0 where unknown (a recording made before steps carried it).
    token_budget: int = 0
    # Slots: how long the CPU waited for this step's slot to come free (its last H2D copy,
    # one slot in async mode), and why the async pipeline read this step alone, if it did.
    slot_wait_ns: int = 0
    sync_fallback: SyncFallback | None = None

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    @property
    def end_ns(self) -> int | None:
        """When the step ended: the end of its latest span (its CPU post-processing, once its
        tokens were delivered; no device work of it runs later). None without spans
        (telemetry off). The one definition of a step's end: every reader asks this."""
        spans = self.spans
        return max(s.end_ns for s in spans) if spans else None

    @property
    def input_wait_ns(self) -> int | None:
        """How long the step's inputs sat on the device before its compute began: from its
        H2D copy's end to its compute span's start (its first kernel where a CUDA graph
        carries timing, so graph launch latency counts). Near 0 in sync mode; in async mode,
        the previous step's compute still running. None without both spans."""
        h2d_end = compute_start = None
        for s in self.spans:
            if s.lane == "h2d":
                h2d_end = s.end_ns
            elif s.lane == "compute":
                compute_start = s.start_ns
        if h2d_end is None or compute_start is None:
            return None
        return max(0, compute_start - h2d_end)


RequestEventKind = Literal["queued", "scheduled", "first_token", "tokens", "finished"]


@dataclass(slots=True)
class RequestEvent:
    """A point in one request's life. For "tokens", num_tokens is how many were emitted;
    for "finished", reason is "stop" | "length" | "abort" | "error" | "engine_dead" (the
    client's, for each of its requests the engine process died with), and cached_tokens and
    preemptions are the request's totals (what the request ledger needs from the request)."""

    request_id: str
    kind: RequestEventKind
    t_ns: int
    num_tokens: int = 0
    prompt_tokens: int = 0
    reason: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    preemptions: int = 0
