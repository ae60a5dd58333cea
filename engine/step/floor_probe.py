"""Measure achievable read bandwidth against transfer size on this GPU (a few seconds).

Owns the measurement behind telemetry.floor's curve: for sizes from 1 MB to 1 GB (powers of
two), read a buffer of that size once with a cold L2 (a 256 MB write between reads evicts
it), timed by CUDA events around the read alone (queued behind a short spin kernel, so the
launch latency of an idle stream is not counted), median of ``repeats``. The read is a sum
into float32: every byte is read once, the write is one scalar. A device-to-device copy of
1 GB gives the peak-copy figure (bytes moved, read + write, over time: the usual "copy
bandwidth"). `curve_for_device` returns the cached or shipped curve of this GPU model or
measures and caches it (the bench suites); `engine_curve` is engine start's: this machine's
cached measurement, else a measurement within a few seconds' budget (about 0.1 s on the
H200), cached per GPU model; the shipped curve only when measuring fails; nothing on a CPU.

It must never run on a CPU (ValueError) nor keep its buffers after returning.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from telemetry.floor import CACHE_DIR, BandwidthCurve, load_curve, save_curve, slug

log = logging.getLogger("gapless.floor")

SIZES_MB: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FLUSH_BYTES = 256 << 20
# A spin of ~20 us before each timed read: the read's launch is then queued behind it when the
# start event fires, so an idle stream's launch latency (several us, most of a 1 MB read's
# time) is not counted as reading time. Kernels of a decode step run back to back likewise.
QUEUE_CYCLES = 40_000
PARTIAL = "partial"
ENGINE_BUDGET_S = 3.0  # engine start: the H200 measures all sizes in ~0.1 s


def measure_curve(device: torch.device | str = "cuda", repeats: int = 5,
                  sizes_mb: tuple[int, ...] = SIZES_MB,
                  budget_s: float | None = None) -> BandwidthCurve:
    """The curve; with ``budget_s`` the sizes left when it runs out are not measured (the
    curve is then marked partial in its method and must not be cached)."""
    t0 = time.perf_counter()
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"the floor probe needs a CUDA device, got {device}")
    big = torch.empty(max(sizes_mb) << 20, dtype=torch.uint8, device=device)
    data = big.view(torch.bfloat16)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    points = []
    partial = False
    for mb in sizes_mb:
        if budget_s is not None and points and time.perf_counter() - t0 > budget_s:
            partial = True
            break
        x = data[: (mb << 20) // 2]
        x.sum(dtype=torch.float32)  # warm-up (kernel selection)
        times = []
        for _ in range(repeats):
            flush.fill_(1)
            torch.cuda._sleep(QUEUE_CYCLES)  # the read is queued when `start` fires
            start.record()
            x.sum(dtype=torch.float32)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        points.append((mb << 20, (mb << 20) / statistics.median(times)))
    half = big.numel() // 2
    src, dst = big[:half], big[half:]
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        torch.cuda._sleep(QUEUE_CYCLES)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    peak_copy = 2 * half / statistics.median(times)
    del big, flush, data, x, src, dst
    torch.cuda.empty_cache()
    return BandwidthCurve(torch.cuda.get_device_name(device), tuple(points), peak_copy,
                          method=f"sum(bf16->fp32) after a {FLUSH_BYTES >> 20} MB L2 flush, "
                                 f"CUDA events, queued behind a spin, median of {repeats}"
                                 + (f"; {PARTIAL} (budget {budget_s:g} s)" if partial else ""),
                          measured=time.strftime("%Y-%m-%d"))


def curve_for_device(device: torch.device | str = "cuda") -> BandwidthCurve:
    """This GPU model's cached (or shipped) curve, else a fresh measurement, cached."""
    name = torch.cuda.get_device_name(torch.device(device))
    curve = load_curve(name)
    if curve is None:
        curve = measure_curve(device)
        try:
            save_curve(curve)
        except OSError:  # a read-only home: measure again next time
            pass
    return curve


def engine_curve(device: torch.device, *, budget_s: float = ENGINE_BUDGET_S,
                 cache_dir: Path | None = None, gpu_name: str | None = None,
                 measure: Callable[..., BandwidthCurve] = measure_curve,
                 ) -> BandwidthCurve | None:
    """At engine start: this machine's measured curve for its GPU model, from the cache, or
    measured now within ``budget_s`` and cached (complete curves only); None on a CPU. A
    failed or partial measurement falls back to the shipped curve of that model (or None).
    The shipped curve is another machine's: a measurement here, once, is preferred."""
    if device.type != "cuda":
        return None
    name = gpu_name or torch.cuda.get_device_name(device)
    path = (cache_dir or CACHE_DIR) / f"{slug(name)}.json"
    if path.is_file():
        try:
            return load_curve_file(path)
        except (OSError, ValueError, KeyError) as e:
            log.warning("floor curve cache %s unreadable (%s): measuring again", path, e)
    t0 = time.perf_counter()
    try:
        curve = measure(device, budget_s=budget_s)
    except Exception as e:  # out of memory at start, a driver error: the shipped curve
        log.warning("floor probe failed (%s); using the shipped curve if any", e)
        return load_curve(name)
    log.info("floor probe: %d sizes in %.2f s on %s", len(curve.points),
             time.perf_counter() - t0, name)
    if PARTIAL in curve.method:
        return load_curve(name) or curve
    try:
        save_curve(curve, path)
    except OSError:  # a read-only home: measure again next time
        pass
    return curve


def load_curve_file(path: Path) -> BandwidthCurve:
    import json

    with open(path) as f:
        return BandwidthCurve.from_dict(json.load(f))
