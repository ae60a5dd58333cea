"""What each timeline lane means, and which group (CPU or device) it belongs to.

Owns the one-line meaning shown beside every lane in the timeline's legend and the CPU /
device grouping. Lanes come from telemetry.records; a lane this file does not know yet (a
newer engine may add one) still gets a group from its name and a generic meaning. Pure data:
no streamlit, no plotly.
"""

from __future__ import annotations

from telemetry.records import CPU_LANES

CPU_GROUP = "CPU (engine thread)"
DEVICE_GROUP = "device (streams)"
RANKS_GROUP = "tensor-parallel ranks"

LANE_MEANINGS: dict[str, str] = {
    "cpu.schedule": "picks the next batch",
    "cpu.prepare": "fills the step's input buffers",
    "cpu.launch": "queues the copies and the forward",
    "cpu.wait": "waits for the device's tokens",
    "cpu.post": "appends tokens, frees finished requests",
    "h2d": "copies inputs host to device",
    "compute.launch": "step queued, first kernel not started",
    "compute": "forward + sampling (step busy)",
    "d2h": "copies sampled tokens back",
}

# What async batching should change, in one line (shown under the timeline).
ASYNC_NOTE = (
    "Sync: the CPU waits (cpu.wait) while compute runs, and compute idles while the CPU "
    "prepares the next step. Async: the next step is prepared during the current one's "
    "compute, so the gaps in the compute lane close, as far as the CPU's work per step is "
    "shorter than the device's."
)


def lane_group(lane: str) -> str:
    """CPU_GROUP for the CPU phases, RANKS_GROUP for the per-rank lanes of a tensor-parallel
    engine, DEVICE_GROUP for the streams."""
    if lane in CPU_LANES or lane.startswith("cpu."):
        return CPU_GROUP
    return RANKS_GROUP if lane.startswith("rank") else DEVICE_GROUP


RANK_MEANINGS = {
    "compute": "this rank's step on its GPU (a straggler's is longer)",
    "comm": "inside collectives (all-reduce, input broadcast, logits gather): waiting for "
            "the other ranks shows here",
}


def lane_meaning(lane: str) -> str:
    if lane.startswith("rank"):
        kind = lane.partition(".")[2]
        if kind in RANK_MEANINGS:
            return RANK_MEANINGS[kind]
    return LANE_MEANINGS.get(lane, "spans the engine reports on this lane")


def rank_lane_colour(lane: str) -> str:
    """Per-rank lanes: compute in the compute lane's green, collectives in purple."""
    return "#756bb1" if lane.endswith(".comm") else "#74c476" if lane.endswith(
        ".compute") else "#888888"


def legend_name(lane: str) -> str:
    """Like "cpu.wait: waits for the device's tokens"."""
    return f"{lane}: {lane_meaning(lane)}"
