"""Measure achievable read bandwidth against transfer size on this GPU (a few seconds).

Owns the measurement behind telemetry.floor's curve: for sizes from 1 MB to 1 GB (powers of
two), read a buffer of that size once with a cold L2 (a 256 MB write between reads evicts
it), timed by CUDA events around the read alone, median of ``repeats``. The read is a sum
into float32: every byte is read once, the write is one scalar. A device-to-device copy of
1 GB gives the peak-copy figure (bytes moved, read + write, over time: the usual "copy
bandwidth"). `curve_for_device` returns the cached curve of this GPU model or measures and
caches it (engine start calls it when ``floor_probe`` is on).

It must never run on a CPU (ValueError) nor keep its buffers after returning.
"""

from __future__ import annotations

import statistics
import time

import torch

from telemetry.floor import BandwidthCurve, load_curve, save_curve

SIZES_MB: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FLUSH_BYTES = 256 << 20


def measure_curve(device: torch.device | str = "cuda", repeats: int = 5,
                  sizes_mb: tuple[int, ...] = SIZES_MB) -> BandwidthCurve:
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"the floor probe needs a CUDA device, got {device}")
    big = torch.empty(max(sizes_mb) << 20, dtype=torch.uint8, device=device)
    data = big.view(torch.bfloat16)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    points = []
    for mb in sizes_mb:
        x = data[: (mb << 20) // 2]
        x.sum(dtype=torch.float32)  # warm-up (kernel selection)
        times = []
        for _ in range(repeats):
            flush.fill_(1)
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
                                 f"CUDA events, median of {repeats}",
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
