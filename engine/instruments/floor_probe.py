"""Measure achievable read bandwidth against transfer size on this GPU (seconds at most).

Owns the measurement behind telemetry.floor's curve: for sizes from 1 MB to 1 GB (powers of
two), the time of one read of that size when reads run back to back, as a decode step's
kernels do: a CUDA graph of n reads (n = 2 GB / size, 3..256) cycling through distinct
buffers of 2 GB in all, so none is served by L2, timed by CUDA events around a replay,
median of ``repeats``, divided by n. A read is a row sum into float32 (every byte read
once, one value per row written), with 1,024- and 4,096-element rows; the faster of the two
at each size is the point (short rows win below ~64 MB, long ones above). A
device-to-device copy of 1 GB gives the peak-copy figure (bytes moved, read + write, over
time: the usual "copy bandwidth").

Why in a graph: one read timed alone by events counts the launch and event overhead into
every read, so a mid-sized read comes out slower than a model's own projection of the same
size read inside the step's graph: a "floor" the step would beat. Kernels that overlap
(programmatic dependent launch, one persistent kernel) can still go below this floor, which
assumes one read after another.

The curve is a property of the GPU, its driver and torch: `engine_curve` (engine start, and
the bench suites through `curve_for_device`) reads the one cached on disk for this GPU
model, driver and torch version (telemetry.floor.cache_path, under GAPLESS_CACHE's floor/
folder), and measures it only when there is none, once, then caches it. The shipped curve
of the GPU model stands in only when measuring fails; nothing on a CPU.

It must never run on a CPU (ValueError) nor keep its buffers after returning.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine import envs
from telemetry.floor import BandwidthCurve, GpuIdentity, cache_path, load_curve, save_curve

log = logging.getLogger("gapless.floor")

SIZES_MB: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
POOL_BYTES = 2 << 30  # the buffers the reads of one size cycle through (>> L2)
READ_ROWS = (1024, 4096)  # bf16 elements a row of the row-sum read
# Its tag in a curve's method: a cached curve without it was measured another way (a read
# timed alone), whose small-read figures are too slow to be a floor; it is measured again.
READ_METHOD = "row sums back to back in a CUDA graph, cold buffers"
# A spin of ~20 us before the timed copy: its launch is then queued behind it when the start
# event fires, so an idle stream's launch latency is not counted as copying time.
QUEUE_CYCLES = 40_000
PARTIAL = "partial"


def _read_seconds(data: torch.Tensor, size: int, row: int, repeats: int,
                  stream: torch.cuda.Stream) -> float:
    """Seconds per read of `size` bytes as rows of `row` bf16 elements summed into fp32, reads
    back to back in one CUDA graph over distinct buffers of `data` (module docstring)."""
    n = max(3, min(256, POOL_BYTES // size))
    views = [data[i * size // 2:(i + 1) * size // 2].view(-1, row)
             for i in range(min(n, POOL_BYTES // size))]
    with torch.cuda.stream(stream):
        views[0].sum(dim=1, dtype=torch.float32)  # warm-up (kernel selection)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(n):
            views[i % len(views)].sum(dim=1, dtype=torch.float32)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / n)
    del graph
    return statistics.median(times)


def measure_curve(device: torch.device | str = "cuda", repeats: int = 5,
                  sizes_mb: tuple[int, ...] = SIZES_MB,
                  budget_s: float | None = None) -> BandwidthCurve:
    """The curve; with ``budget_s`` the sizes left when it runs out are not measured (the
    curve is then marked partial in its method and must not be cached)."""
    t0 = time.perf_counter()
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"the floor probe needs a CUDA device, got {device}")
    big = torch.empty(max(POOL_BYTES, max(sizes_mb) << 20), dtype=torch.uint8, device=device)
    data = big.view(torch.bfloat16)
    stream = torch.cuda.Stream(device)
    points = []
    partial = False
    for mb in sizes_mb:
        if budget_s is not None and points and time.perf_counter() - t0 > budget_s:
            partial = True
            break
        size = mb << 20
        best = min(_read_seconds(data, size, row, repeats, stream) for row in READ_ROWS)
        points.append((size, size / best))
    half = (max(sizes_mb) << 20) // 2
    src, dst = big[:half], big[half:2 * half]
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        torch.cuda._sleep(QUEUE_CYCLES)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    peak_copy = 2 * half / statistics.median(times)
    del big, data, src, dst
    torch.cuda.empty_cache()
    return BandwidthCurve(torch.cuda.get_device_name(device), tuple(points), peak_copy,
                          method=f"{READ_METHOD}, median of {repeats}"
                                 + (f"; {PARTIAL} (budget {budget_s:g} s)" if partial else ""),
                          measured=time.strftime("%Y-%m-%d"))


def gpu_identity(device: torch.device) -> GpuIdentity:
    """What a measured curve belongs to: the GPU model, the driver (NVML's version string,
    else the CUDA driver API version torch reports) and torch's version."""
    name = torch.cuda.get_device_name(device)
    driver = "unknown"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = str(pynvml.nvmlSystemGetDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML here: the driver API version is the next best thing
        get = getattr(torch._C, "_cuda_getDriverVersion", None)
        if get is not None:
            try:
                driver = f"cuda-{get()}"
            except Exception:
                pass
    return GpuIdentity(name, driver, torch.__version__)


def engine_curve(device: torch.device, *, cache_dir: Path | None = None,
                 identity: GpuIdentity | None = None,
                 measure: Callable[..., BandwidthCurve] = measure_curve,
                 ) -> BandwidthCurve | None:
    """This GPU's curve: the cached measurement for its model, driver and torch version, or
    a measurement now, cached (complete curves only: the next start reads it); None on a CPU.
    A failed or partial measurement falls back to the shipped curve of the model, if any
    (another machine's: a measurement here is preferred, and tried again next time)."""
    if device.type != "cuda":
        return None
    ident = identity or gpu_identity(device)
    path = cache_path(ident, cache_dir if cache_dir is not None else default_cache_dir())
    if path.is_file():
        try:
            cached = load_curve_file(path)
            if READ_METHOD in cached.method:
                return cached
            log.info("floor curve cache %s was measured another way: measuring again", path)
        except (OSError, ValueError, KeyError) as e:
            log.warning("floor curve cache %s unreadable (%s): measuring again", path, e)
    t0 = time.perf_counter()
    try:
        curve = measure(device)
    except Exception as e:  # out of memory at start, a driver error: the shipped curve
        log.warning("floor probe failed (%s); using the shipped curve if any", e)
        return load_curve(ident.gpu)
    log.info("floor probe: %d sizes in %.2f s on %s, cached in %s", len(curve.points),
             time.perf_counter() - t0, ident.gpu, path)
    if PARTIAL in curve.method:
        return load_curve(ident.gpu) or curve
    try:
        save_curve(curve, path)
    except OSError:  # a read-only home: measure again next time
        pass
    return curve


def default_cache_dir() -> Path:
    """Where measured curves are cached: the floor/ folder of gapless's cache."""
    return envs.get(envs.GAPLESS_CACHE) / "floor"


def curve_for_device(device: torch.device | str = "cuda") -> BandwidthCurve:
    """`engine_curve` for a CUDA device that must have a curve (the bench suites)."""
    curve = engine_curve(torch.device(device))
    if curve is None:
        raise ValueError(f"the floor probe needs a CUDA device, got {device}")
    return curve


def load_curve_file(path: Path) -> BandwidthCurve:
    import json

    with open(path) as f:
        return BandwidthCurve.from_dict(json.load(f))
