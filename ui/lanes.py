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
    """CPU_GROUP for the CPU phases, DEVICE_GROUP for the streams."""
    return CPU_GROUP if lane in CPU_LANES or lane.startswith("cpu.") else DEVICE_GROUP


def lane_meaning(lane: str) -> str:
    return LANE_MEANINGS.get(lane, "spans the engine reports on this lane")


def legend_name(lane: str) -> str:
    """Like "cpu.wait: waits for the device's tokens"."""
    return f"{lane}: {lane_meaning(lane)}"
