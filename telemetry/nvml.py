"""NVML sampler: GPU utilisation, memory, SM clock and power on a background thread.

Owns the only NVML calls in the project. It reads what the driver reports so the dashboard
can show NVML's utilisation beside our own busy fraction (docs/design.md section 4: NVML counts
sample periods in which any kernel ran, so it reads near 100% even with gaps).

It must never raise to its caller because a GPU, driver or the nvidia-ml-py package is
missing: it reports ``available = False`` with a ``reason`` such as
"no GPU: NVML library not found", and every reading method returns None / []. It must never
touch CUDA or torch, and never block the engine (it runs on its own daemon thread).

Utilisation comes from ``nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, last_ts)``
where the driver supports it: the mean of the driver's own samples taken since the previous
reading, which loses nothing between our polls. Where it is
not supported we fall back to ``nvmlDeviceGetUtilizationRates``.

Each poll also reads the GPM counters (telemetry.gpm: memory bandwidth used, SM activity)
where the GPU has them, into the same reading; ``gpm_reason`` says why they are missing.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from telemetry.gpm import GpmSampler

UtilSource = Literal["samples", "rates"]

# c_nvmlValue_t union member for each NVML_VALUE_TYPE_* (0..6).
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass(slots=True, frozen=True)
class NvmlReading:
    """One poll of the device. A field is None when the device does not report it."""

    t_ns: int  # host time of the poll, time.perf_counter_ns()
    gpu_util_pct: float | None
    util_source: UtilSource | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    sm_clock_mhz: int | None
    power_w: float | None
    # GPM counters over the interval since the previous poll (percent), None where missing.
    dram_bw_util_pct: float | None = None  # memory bandwidth used, % of peak
    sm_util_pct: float | None = None
    graphics_util_pct: float | None = None
    sm_occupancy_pct: float | None = None
    gpm_reason: str | None = None  # why the GPM fields are None (None when they are read)


def _error_name(exc: BaseException) -> str:
    # pynvml builds one NVMLError_* subclass per error code; match on the class names in the
    # MRO so any module with the same naming (a fake in tests) maps the same way.
    for cls in type(exc).__mro__:
        if cls.__name__.startswith("NVMLError_"):
            return cls.__name__
    return type(exc).__name__


def no_gpu_reason(exc: BaseException, device_index: int = 0) -> str:
    """A short, user-facing reason for why NVML cannot be used."""
    name = _error_name(exc)
    if isinstance(exc, ImportError):
        return "no GPU: nvidia-ml-py (module pynvml) is not installed"
    known = {
        "NVMLError_LibraryNotFound": "no GPU: NVML library not found",
        "NVMLError_DriverNotLoaded": "no GPU: driver not loaded",
        "NVMLError_NoPermission": "no GPU: no permission to use NVML",
        "NVMLError_GpuIsLost": "no GPU: the GPU has fallen off the bus",
        "NVMLError_InvalidArgument": f"no GPU: no device with index {device_index}",
        "NVMLError_NotFound": f"no GPU: no device with index {device_index}",
    }
    return known.get(name, f"no GPU: NVML error {name}: {exc}")


class NvmlSampler:
    """Polls one GPU every ``interval_s`` seconds on a daemon thread, keeping a history.

    ``nvml`` injects a module with pynvml's API (tests use a fake); by default pynvml is
    imported on first use. NVML is initialised lazily, by ``start()``, ``sample_once()`` or
    the first look at ``available`` / ``reason``.
    """

    def __init__(
        self,
        interval_s: float = 0.25,
        device_index: int = 0,
        history_len: int = 2400,
        nvml: ModuleType | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        gpm: bool = True,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if device_index < 0:
            raise ValueError(f"device_index must be >= 0, got {device_index}")
        if history_len < 1:
            raise ValueError(f"history_len must be >= 1, got {history_len}")
        self.interval_s = float(interval_s)
        self.device_index = device_index
        self._nvml: Any = nvml
        self._clock = clock
        self._history: deque[NvmlReading] = deque(maxlen=history_len)
        self._lock = threading.Lock()  # guards probing, the history and thread start/stop
        self._probed = False
        self._available = False
        self._reason = "NVML not probed yet"
        self._handle: Any = None
        self._use_samples = False
        self._last_sample_us = 0  # NVML sample timestamps are microseconds
        self._last_util: float | None = None
        self.device_name: str | None = None
        self._want_gpm = gpm
        self._gpm: GpmSampler | None = None
        self.last_error: str | None = None  # the latest failed query while sampling
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- availability ----------------------------------------------------------------------

    @property
    def available(self) -> bool:
        self._probe()
        return self._available

    @property
    def reason(self) -> str:
        """Why NVML is unavailable ("no GPU: ..."), or which device is sampled."""
        self._probe()
        return self._reason

    def _probe(self) -> None:
        if self._probed:  # the common case, without taking the lock
            return
        with self._lock:
            if self._probed:
                return
            self._probed = True
            try:
                nvml = self._nvml or importlib.import_module("pynvml")
                self._nvml = nvml
                nvml.nvmlInit()
            except Exception as exc:  # ImportError or any NVMLError: report, never raise
                self._reason = no_gpu_reason(exc, self.device_index)
                return
            try:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
                name = nvml.nvmlDeviceGetName(self._handle)
                self.device_name = name.decode() if isinstance(name, bytes) else str(name)
            except Exception as exc:
                self._reason = no_gpu_reason(exc, self.device_index)
                self._shutdown_quietly()
                return
            self._use_samples = self._samples_supported()
            if self._want_gpm:
                self._gpm = GpmSampler(nvml, self._handle, self.device_name)
            self._available = True
            source = "samples" if self._use_samples else "utilisation rates"
            self._reason = f"NVML: {self.device_name} (index {self.device_index}), {source}"

    @property
    def gpm_reason(self) -> str:
        """Why GPM counters are missing, or which device they come from ("GPM: ...")."""
        self._probe()
        if self._gpm is None:
            return self._reason if not self._available else "GPM sampling is off"
        return self._gpm.reason

    def _samples_supported(self) -> bool:
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetSamples"):
            return False
        try:
            nvml.nvmlDeviceGetSamples(self._handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        except Exception as exc:
            # NotFound only means "no samples buffered yet": the call itself works.
            return _error_name(exc) == "NVMLError_NotFound"
        return True

    def _shutdown_quietly(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        self._handle = None

    # -- sampling --------------------------------------------------------------------------

    def sample_once(self) -> NvmlReading | None:
        """Poll the device now, append the reading to the history and return it (None when
        NVML is unavailable). The background thread calls this; so may tests."""
        if not self.available:
            return None
        nvml, h = self._nvml, self._handle
        util, source = self._utilisation()
        mem = self._query(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        clock = self._query(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        power_mw = self._query(lambda: nvml.nvmlDeviceGetPowerUsage(h))
        t_ns = self._clock()
        gpm = self._gpm.sample(t_ns) if self._gpm is not None else None
        if self._gpm is None:
            gpm_reason: str | None = "GPM sampling is off"
        elif gpm is None:
            gpm_reason = (self._gpm.last_error or "GPM: first sample, no interval yet"
                          if self._gpm.available else self._gpm.reason)
        else:
            gpm_reason = None
        reading = NvmlReading(
            t_ns=t_ns,
            gpu_util_pct=util,
            util_source=source,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            sm_clock_mhz=int(clock) if clock is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            dram_bw_util_pct=gpm.dram_bw_util_pct if gpm else None,
            sm_util_pct=gpm.sm_util_pct if gpm else None,
            graphics_util_pct=gpm.graphics_util_pct if gpm else None,
            sm_occupancy_pct=gpm.sm_occupancy_pct if gpm else None,
            gpm_reason=gpm_reason,
        )
        with self._lock:
            self._history.append(reading)
        return reading

    def _query(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # one unsupported field must not lose the others
            self.last_error = f"{_error_name(exc)}: {exc}"
            return None

    def _utilisation(self) -> tuple[float | None, UtilSource | None]:
        nvml, h = self._nvml, self._handle
        if self._use_samples:
            try:
                vtype, samples = nvml.nvmlDeviceGetSamples(
                    h, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_sample_us
                )
            except Exception as exc:
                if _error_name(exc) != "NVMLError_NotFound":
                    self.last_error = f"{_error_name(exc)}: {exc}"
                samples = []
            if samples:
                field = _VALUE_FIELDS[vtype] if 0 <= vtype < len(_VALUE_FIELDS) else "uiVal"
                # The first call (last_ts 0) returns the driver's whole buffer: take only the
                # newest sample so the first reading is "now", not a mean over seconds ago.
                fresh = samples[-1:] if self._last_sample_us == 0 else samples
                values = [float(getattr(s.sampleValue, field)) for s in fresh]
                self._last_sample_us = max(int(s.timeStamp) for s in samples)
                self._last_util = sum(values) / len(values)
            # No new sample since the last poll (we poll faster than the driver samples):
            # the previous value is still the newest truth.
            return self._last_util, "samples" if self._last_util is not None else None
        rates = self._query(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if rates is None:
            return None, None
        return float(rates.gpu), "rates"

    # -- reading ---------------------------------------------------------------------------

    def latest(self) -> NvmlReading | None:
        with self._lock:
            return self._history[-1] if self._history else None

    def history(self, last_n: int | None = None) -> list[NvmlReading]:
        """The newest ``last_n`` readings (all held when None), oldest first."""
        with self._lock:
            items = list(self._history)
        if last_n is None:
            return items
        if last_n < 0:
            raise ValueError(f"last_n must be >= 0, got {last_n}")
        return items[len(items) - last_n :] if last_n else []

    # -- thread ----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def start(self) -> NvmlSampler:
        """Start polling (no-op when already running or when NVML is unavailable)."""
        if not self.available:
            return self
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="nvml-sampler", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop polling and wait for the thread (no-op when not running). NVML stays
        initialised, so start() can resume; close() also shuts NVML down."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def close(self) -> None:
        self.stop()
        with self._lock:
            if self._available:
                if self._gpm is not None:
                    self._gpm.close()
                self._shutdown_quietly()
                self._available = False
                self._reason = "NVML sampler closed"
            self._probed = True

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # never let the thread die silently mid-run
                self.last_error = f"{type(exc).__name__}: {exc}"
            stop.wait(self.interval_s)

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
