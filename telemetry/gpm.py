"""NVML GPM (GPU Performance Monitoring) counters: memory bandwidth used, SM activity.

Owns the GPM calls: probing support, keeping the previous sample, and turning two samples
into metric values (``nvmlGpmSampleGet`` twice, ``nvmlGpmMetricsGet`` over the pair).
GPM exists on Hopper and later with a recent driver; it reads the hardware's own counters,
so *memory bandwidth used* (DRAM_BW_UTIL, % of peak DRAM bandwidth) says how near a decode
step runs to its byte floor, where NVML's utilisation only says "a kernel ran".

It must never raise to its caller because GPM is missing: ``reason`` says why ("no GPU: ...",
"GPM not supported on <device> (Hopper or newer needed)", "nvidia-ml-py too old: no GPM
API"), and ``sample()`` returns None. It must never touch CUDA or torch; it is driven by the
NVML sampler's thread (telemetry.nvml), which owns nvmlInit and the device handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# GpmReading field -> pynvml constant name.
GPM_METRICS: dict[str, str] = {
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
    "graphics_util_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
}
_GPM_API = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet",
            "nvmlGpmMetricsGet", "c_nvmlGpmMetricsGet_t")


@dataclass(slots=True, frozen=True)
class GpmReading:
    """Counters averaged over the interval between two GPM samples (percent, 0..100);
    a field is None when the device did not return that metric."""

    dram_bw_util_pct: float | None
    sm_util_pct: float | None
    graphics_util_pct: float | None
    sm_occupancy_pct: float | None
    interval_ns: int  # the length of the interval the values average over


def _error_name(exc: BaseException) -> str:
    for cls in type(exc).__mro__:
        if cls.__name__.startswith("NVMLError_"):
            return cls.__name__
    return type(exc).__name__


class GpmSampler:
    """Reads GPM metrics for one device handle. Not thread-safe: one thread calls sample().

    ``nvml`` is the pynvml module (or a fake with the same API), already initialised;
    ``handle`` its device handle (None when there is no device: GPM then reports why).
    """

    def __init__(self, nvml: Any, handle: Any, device_name: str | None = None,
                 no_device_reason: str = "no GPU") -> None:
        self._nvml = nvml
        self._handle = handle
        self._prev: Any = None
        self._prev_ns = 0
        self._spare: Any = None
        self._ids: list[tuple[str, int]] = []
        self.last_error: str | None = None
        self.available = False
        self.reason = self._probe(device_name, no_device_reason)

    def _probe(self, device_name: str | None, no_device_reason: str) -> str:
        nvml = self._nvml
        if nvml is None or self._handle is None:
            return no_device_reason
        if not all(hasattr(nvml, name) for name in _GPM_API):
            return "nvidia-ml-py too old: no GPM API (nvmlGpmMetricsGet)"
        device = device_name or "this GPU"
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(self._handle)
        except Exception as exc:
            return f"GPM not supported on {device} ({_error_name(exc)}; driver too old?)"
        if not getattr(support, "isSupportedDevice", 0):
            return f"GPM not supported on {device} (Hopper or newer needed)"
        self._ids = [(f, int(getattr(nvml, c))) for f, c in GPM_METRICS.items() if hasattr(nvml, c)]
        try:
            self._prev = nvml.nvmlGpmSampleAlloc()
            self._spare = nvml.nvmlGpmSampleAlloc()
        except Exception as exc:
            return f"GPM sample allocation failed ({_error_name(exc)})"
        self.available = True
        return f"GPM: {device}"

    def sample(self, t_ns: int) -> GpmReading | None:
        """Take a GPM sample at host time ``t_ns``; return the metrics over the interval
        since the previous call (None on the first call, when unavailable or on error)."""
        if not self.available:
            return None
        nvml = self._nvml
        cur = self._spare
        try:
            nvml.nvmlGpmSampleGet(self._handle, cur)
        except Exception as exc:
            self.last_error = f"GPM sample: {_error_name(exc)}: {exc}"
            return None
        prev, prev_ns = self._prev, self._prev_ns
        self._prev, self._prev_ns, self._spare = cur, t_ns, prev  # reuse the old buffer
        if prev_ns == 0:
            return None
        return self._metrics(prev, cur, t_ns - prev_ns)

    def _metrics(self, first: Any, second: Any, interval_ns: int) -> GpmReading | None:
        nvml = self._nvml
        req = nvml.c_nvmlGpmMetricsGet_t()
        req.version = nvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(self._ids)
        req.sample1, req.sample2 = first, second
        for i, (_, metric_id) in enumerate(self._ids):
            req.metrics[i].metricId = metric_id
        try:
            nvml.nvmlGpmMetricsGet(req)
        except Exception as exc:
            self.last_error = f"GPM metrics: {_error_name(exc)}: {exc}"
            return None
        values: dict[str, float | None] = dict.fromkeys(GPM_METRICS)
        for i, (name, _) in enumerate(self._ids):
            m = req.metrics[i]
            values[name] = float(m.value) if int(m.nvmlReturn) == 0 else None
        return GpmReading(interval_ns=interval_ns, **values)  # type: ignore[arg-type]

    def close(self) -> None:
        """Free the two sample buffers (GPM stays unavailable afterwards)."""
        if not self.available:
            return
        self.available = False
        for buf in (self._prev, self._spare):
            try:
                self._nvml.nvmlGpmSampleFree(buf)
            except Exception:
                pass
