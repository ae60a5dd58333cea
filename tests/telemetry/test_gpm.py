"""GPM counters (memory bandwidth used, SM activity) on a fake pynvml: the two-sample
arithmetic, the reasons given where GPM is missing, and their place in NVML readings."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from test_nvml import FakeNvml, ticking_clock

from telemetry.gpm import GpmSampler
from telemetry.nvml import NvmlSampler


class _Metric(SimpleNamespace):
    pass


class _MetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric(metricId=0, nvmlReturn=0, value=0.0) for _ in range(210)]


class FakeGpmNvml(FakeNvml):
    """FakeNvml plus GPM: each sample holds a DRAM byte counter; DRAM_BW_UTIL is the
    counter's growth over the pair as a percent of a made-up peak."""

    NVML_GPM_METRIC_GRAPHICS_UTIL = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def __init__(self, supported: bool = True) -> None:
        super().__init__()
        self.supported = supported
        self.dram_counter = 0
        self.freed = 0

    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:
        return SimpleNamespace(version=1, isSupportedDevice=int(self.supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(counter=None)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed += 1

    def nvmlGpmSampleGet(self, h: str, sample: Any) -> Any:
        sample.counter = self.dram_counter
        return sample

    def nvmlGpmMetricsGet(self, req: _MetricsGet) -> _MetricsGet:
        assert req.version == 1 and req.sample1 is not req.sample2
        grew = req.sample2.counter - req.sample1.counter
        for m in req.metrics[: req.numMetrics]:
            if m.metricId == self.NVML_GPM_METRIC_DRAM_BW_UTIL:
                m.value = float(grew)
            elif m.metricId == self.NVML_GPM_METRIC_SM_OCCUPANCY:
                m.nvmlReturn = 3  # NVML_ERROR_NOT_SUPPORTED for this one metric
            else:
                m.value = 50.0
        return req


@pytest.fixture
def gpm_fake(monkeypatch: pytest.MonkeyPatch) -> FakeGpmNvml:
    mod = FakeGpmNvml()
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_bandwidth_is_read_over_the_interval_between_two_samples(gpm_fake: FakeGpmNvml) -> None:
    g = GpmSampler(gpm_fake, "h0", "Fake H200")
    assert g.available and g.reason == "GPM: Fake H200"
    assert g.sample(1_000) is None  # one sample is not an interval
    gpm_fake.dram_counter = 77
    r = g.sample(251_000)
    assert r is not None and r.dram_bw_util_pct == 77.0 and r.interval_ns == 250_000
    assert r.sm_util_pct == 50.0 and r.graphics_util_pct == 50.0
    assert r.sm_occupancy_pct is None  # the device refused that metric: not a zero
    gpm_fake.dram_counter = 97
    assert g.sample(501_000).dram_bw_util_pct == 20.0  # the newest interval only
    g.close()
    assert gpm_fake.freed == 2 and g.sample(9_000_000) is None


def test_missing_gpm_says_why() -> None:
    assert GpmSampler(FakeGpmNvml(supported=False), "h0", "Fake A100").reason == (
        "GPM not supported on Fake A100 (Hopper or newer needed)")
    assert GpmSampler(FakeNvml(), "h0").reason.startswith("nvidia-ml-py too old")
    no_gpu = GpmSampler(None, None, no_device_reason="no GPU: NVML library not found")
    assert not no_gpu.available and no_gpu.reason == "no GPU: NVML library not found"
    assert no_gpu.sample(1) is None


def test_nvml_readings_carry_gpm_counters(gpm_fake: FakeGpmNvml) -> None:
    s = NvmlSampler(clock=ticking_clock())
    assert s.gpm_reason == "GPM: Fake H200"
    first = s.sample_once()
    assert first.dram_bw_util_pct is None and "first sample" in first.gpm_reason
    gpm_fake.dram_counter = 64
    second = s.sample_once()
    assert second.dram_bw_util_pct == 64.0 and second.gpm_reason is None


def test_nvml_readings_say_why_gpm_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeGpmNvml(supported=False))
    s = NvmlSampler(clock=ticking_clock())
    r = s.sample_once()
    assert r.dram_bw_util_pct is None
    assert r.gpm_reason == "GPM not supported on Fake H200 (Hopper or newer needed)"
    assert NvmlSampler(gpm=False, clock=ticking_clock()).gpm_reason == "GPM sampling is off"
