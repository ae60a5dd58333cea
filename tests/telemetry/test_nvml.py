"""NvmlSampler: the real no-GPU path on this machine, and the sampling logic on a fake NVML."""

from __future__ import annotations

import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from telemetry.nvml import NvmlReading, NvmlSampler, no_gpu_reason

# -- the real module, no GPU ------------------------------------------------------------------


def _real_nvml_error() -> BaseException | None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return exc
    pynvml.nvmlShutdown()
    return None


def test_absent_gpu_reports_no_gpu_and_never_raises() -> None:
    exc = _real_nvml_error()
    if exc is None:
        pytest.skip("NVML works on this machine: the absent path cannot be exercised for real")
    s = NvmlSampler(interval_s=0.01)
    assert s.available is False
    assert s.reason == no_gpu_reason(exc)
    assert s.reason.startswith("no GPU: ")
    if type(exc).__name__ == "NVMLError_LibraryNotFound":
        assert s.reason == "no GPU: NVML library not found"
    s.start()
    s.start()
    assert not s.running
    assert s.sample_once() is None
    assert s.latest() is None and s.history() == [] and s.history(5) == []
    s.stop()
    s.stop()
    s.close()
    with NvmlSampler() as s2:
        assert s2.latest() is None


def test_missing_package_reports_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise
    s = NvmlSampler()
    assert not s.available
    assert s.reason == "no GPU: nvidia-ml-py (module pynvml) is not installed"


# -- a fake pynvml ----------------------------------------------------------------------------


class NVMLError(Exception):
    pass


def _error(name: str) -> type[NVMLError]:
    return type(name, (NVMLError,), {})


class FakeNvml(ModuleType):
    """The slice of pynvml's API the sampler uses, with scripted answers."""

    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_CLOCK_SM = 1
    NVMLError = NVMLError
    NVMLError_NotFound = _error("NVMLError_NotFound")
    NVMLError_NotSupported = _error("NVMLError_NotSupported")
    NVMLError_DriverNotLoaded = _error("NVMLError_DriverNotLoaded")
    NVMLError_InvalidArgument = _error("NVMLError_InvalidArgument")

    def __init__(self, *, samples: bool = True) -> None:
        super().__init__("pynvml")
        self.init_error: BaseException | None = None
        self.handle_error: BaseException | None = None
        self.power_error: BaseException | None = None
        self.buffer: list[tuple[int, int]] = []  # (timestamp_us, util %)
        self.rates_gpu = 42
        self.calls: dict[str, int] = {}
        if not samples:
            self.samples_error: BaseException | None = self.NVMLError_NotSupported()
        else:
            self.samples_error = None

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:
        self._count("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self._count("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if self.handle_error is not None:
            raise self.handle_error
        return f"h{index}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"Fake H200"

    def nvmlDeviceGetSamples(self, h: str, kind: int, last_ts: int) -> tuple[int, list[Any]]:
        self._count("samples")
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        if self.samples_error is not None:
            raise self.samples_error
        new = [(t, v) for t, v in self.buffer if t > last_ts]
        if not new:
            raise self.NVMLError_NotFound()
        return 1, [
            SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in new
        ]

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        self._count("rates")
        return SimpleNamespace(gpu=self.rates_gpu, memory=7)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=30 * 2**30, total=141 * 2**30, free=111 * 2**30)

    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        assert kind == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        if self.power_error is not None:
            raise self.power_error
        return 350_500  # mW


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    mod = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", mod)  # the sampler's own import finds it
    return mod


def ticking_clock() -> Any:
    t = iter(range(1000, 10**9, 1000))
    return lambda: next(t)


def test_present_gpu_samples_utilisation_from_driver_samples(fake: FakeNvml) -> None:
    fake.buffer = [(100, 10), (200, 20), (300, 30)]
    s = NvmlSampler(clock=ticking_clock())
    assert s.available
    assert s.reason == "NVML: Fake H200 (index 0), samples"
    assert s.device_name == "Fake H200"
    first = s.sample_once()
    # The first poll takes only the newest buffered sample, not the whole history.
    assert first == NvmlReading(
        t_ns=1000,
        gpu_util_pct=30.0,
        util_source="samples",
        memory_used_bytes=30 * 2**30,
        memory_total_bytes=141 * 2**30,
        sm_clock_mhz=1980,
        power_w=350.5,
        gpm_reason="nvidia-ml-py too old: no GPM API (nvmlGpmMetricsGet)",  # the fake has none
    )
    fake.buffer += [(400, 50), (500, 70)]
    assert s.sample_once().gpu_util_pct == 60.0  # mean of the samples since the last poll
    # Nothing new since 500 us: the newest value still stands.
    third = s.sample_once()
    assert (third.gpu_util_pct, third.util_source) == (60.0, "samples")
    assert s.last_error is None  # "no new samples" is not an error
    assert fake.calls.get("rates", 0) == 0
    assert [r.t_ns for r in s.history()] == [1000, 2000, 3000]
    assert s.history(2) == s.history()[1:]
    assert s.history(0) == []
    assert s.latest() == third


def test_falls_back_to_utilisation_rates(fake: FakeNvml) -> None:
    fake.samples_error = fake.NVMLError_NotSupported()
    s = NvmlSampler()
    assert s.reason.endswith("utilisation rates")
    r = s.sample_once()
    assert (r.gpu_util_pct, r.util_source) == (42.0, "rates")
    assert fake.calls["rates"] == 1


def test_falls_back_when_the_api_lacks_get_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = FakeNvml()
    monkeypatch.delattr(FakeNvml, "nvmlDeviceGetSamples")
    s = NvmlSampler(nvml=mod)
    assert s.sample_once().util_source == "rates"


def test_one_unsupported_field_keeps_the_others(fake: FakeNvml) -> None:
    fake.buffer = [(10, 5)]
    fake.power_error = fake.NVMLError_NotSupported("power")
    r = NvmlSampler().sample_once()
    assert r.power_w is None
    assert (r.gpu_util_pct, r.sm_clock_mhz) == (5.0, 1980)


@pytest.mark.parametrize(
    ("where", "error", "reason"),
    [
        ("init_error", "NVMLError_DriverNotLoaded", "no GPU: driver not loaded"),
        ("handle_error", "NVMLError_InvalidArgument", "no GPU: no device with index 3"),
    ],
)
def test_init_failures_become_reasons(fake: FakeNvml, where: str, error: str, reason: str) -> None:
    setattr(fake, where, getattr(fake, error)())
    s = NvmlSampler(device_index=3)
    assert not s.available
    assert s.reason == reason
    assert s.sample_once() is None
    s.start()
    assert not s.running


def test_background_thread_start_stop_idempotent(fake: FakeNvml) -> None:
    fake.buffer = [(10, 80)]
    s = NvmlSampler(interval_s=0.005)
    s.start()
    thread = s._thread
    s.start()
    assert s._thread is thread and s.running
    deadline = time.monotonic() + 5.0
    while len(s.history()) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(s.history()) >= 3
    s.stop()
    s.stop()
    assert not s.running
    n = len(s.history())
    time.sleep(0.03)
    assert len(s.history()) == n  # stopped means stopped
    s.start()  # and it can resume
    assert s.running
    s.close()
    s.close()
    assert not s.running and not s.available
    assert fake.calls["shutdown"] == 1
    assert s.latest().gpu_util_pct == 80.0


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSampler(interval_s=0)
    with pytest.raises(ValueError, match="device_index"):
        NvmlSampler(device_index=-1)
