"""The honest floor and the separate-kernel reference: achievable read bandwidth against size.

Small reads never reach a GPU's peak bandwidth: a kernel that reads 2 MB pays its launch,
its ramp-up and its tail for little data. A `BandwidthCurve` holds measured (bytes, bytes/s)
points from 1 MB to 1 GB, read with a cold L2, and gives the time of one lone cold read: the
bandwidth at that size, interpolated in log-log, clamped at the ends. A curve belongs to a
GPU model, its driver and torch's version (`GpuIdentity`): engine/instruments/floor_probe.py
measures it once per identity and caches it under `cache_path` in the folder its caller
names; telemetry/curves/<gpu>.json are the shipped ones, per GPU model, for where nothing
was measured.

The floor is the peak-copy floor: all bytes at one peak bandwidth, the limit a step cannot
beat. The *separate-kernel reference* prices each read as its own cold kernel at its size's
bandwidth: what today's one-kernel-per-read shape of a step costs. It is no floor (kernels
that overlap, or one kernel that streams across boundaries, run below it), so a figure
against it is shown as "x separate-kernel reference", never as "x floor". Figures recorded
under the reference's former key names read as the new ones through `renamed_floor_keys`.

Pure: no torch, no clocks, nothing of ours; files are read only where asked.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CURVES_DIR = Path(__file__).with_name("curves")
DEFAULT_GPU = "NVIDIA H200"


@dataclass(frozen=True, slots=True)
class BandwidthCurve:
    """Achievable read bandwidth (bytes/s) at each transfer size (bytes), sizes ascending."""

    gpu: str
    points: tuple[tuple[int, float], ...]
    peak_copy_bw: float | None = None  # device-to-device copy, bytes moved / s
    method: str = ""
    measured: str = ""

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a bandwidth curve needs at least one (bytes, bytes/s) point")
        sizes = [b for b, _ in self.points]
        if sizes != sorted(sizes) or any(b <= 0 or bw <= 0 for b, bw in self.points):
            raise ValueError("curve points must be positive and sorted by size")

    def bandwidth_at(self, nbytes: float) -> float:
        """Bytes/s reading ``nbytes`` in one go: log-log interpolation, clamped at the ends."""
        pts = self.points
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1]
        for (b0, w0), (b1, w1) in zip(pts, pts[1:], strict=False):
            if b0 <= nbytes <= b1:
                t = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
                return math.exp(math.log(w0) + t * (math.log(w1) - math.log(w0)))
        return pts[-1][1]

    @property
    def best_bw(self) -> float:
        return max(bw for _, bw in self.points)

    def seconds(self, nbytes: float) -> float:
        return nbytes / self.bandwidth_at(nbytes) if nbytes > 0 else 0.0

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "method": self.method, "measured": self.measured,
                "peak_copy_bw": self.peak_copy_bw,
                "points": [[b, bw] for b, bw in self.points]}

    @classmethod
    def from_dict(cls, d: dict) -> BandwidthCurve:
        return cls(str(d["gpu"]), tuple((int(b), float(bw)) for b, bw in d["points"]),
                   d.get("peak_copy_bw"), str(d.get("method", "")), str(d.get("measured", "")))


def slug(gpu: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the curve file's name for a GPU model."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What a measured curve holds for: the GPU model, the driver version, torch's version."""

    gpu: str
    driver: str
    torch: str


def cache_path(ident: GpuIdentity, cache_dir: Path) -> Path:
    """The cached curve of one GPU model, driver and torch version in ``cache_dir``: a new
    driver or torch gets a measurement of its own."""
    name = f"{slug(ident.gpu)}--driver-{slug(ident.driver)}--torch-{slug(ident.torch)}"
    return cache_dir / f"{name}.json"


def load_curve(gpu: str = DEFAULT_GPU) -> BandwidthCurve | None:
    """The shipped curve of a GPU model, or None."""
    path = CURVES_DIR / f"{slug(gpu)}.json"
    if not path.is_file():
        return None
    with open(path) as f:
        return BandwidthCurve.from_dict(json.load(f))


def save_curve(curve: BandwidthCurve, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(curve.to_dict(), indent=1) + "\n")
    tmp.replace(path)
    return path


def separate_kernel_seconds(bytes_list: Iterable[float], curve: BandwidthCurve | None = None,
                            ) -> float | None:
    """The separate-kernel reference: seconds to read each of ``bytes_list`` (one read per
    kernel or per tensor) as a lone cold read at its size's achievable bandwidth, summed. A
    reference for separate kernels, not a floor. ``curve`` defaults to the shipped curve of
    DEFAULT_GPU; None when there is no curve."""
    curve = curve or load_curve()
    if curve is None:
        return None
    return sum(curve.seconds(b) for b in bytes_list)


def one_read_seconds(nbytes: float, curve: BandwidthCurve | None = None) -> float | None:
    """One read of ``nbytes`` at the curve's bandwidth for that size; None without a curve
    (so not named floor_seconds, which bench.harness.floor's callers expect a float of)."""
    return separate_kernel_seconds([nbytes], curve)


# The separate-kernel reference's keys in figures written before it had its name (the shipped
# anatomy JSON): read as the new keys, in this one place.
_FORMER_KEYS = {"size_aware_floor_us": "separate_kernel_reference_us",
                "x_size_aware_floor": "x_separate_kernel_reference"}


def renamed_floor_keys(obj: Any) -> Any:
    """``obj`` (plain JSON data) with the separate-kernel reference's former keys renamed to
    its present ones, at any depth; a present key wins over a former one. Never mutates."""
    if isinstance(obj, dict):
        return {_FORMER_KEYS.get(k, k): renamed_floor_keys(v) for k, v in obj.items()
                if not (k in _FORMER_KEYS and _FORMER_KEYS[k] in obj)}
    if isinstance(obj, list):
        return [renamed_floor_keys(v) for v in obj]
    return obj
