"""Engine start's floor curve on a CPU, with a fake measurement: nothing on a CPU; measured
once per GPU model and cached; a partial (over budget) or failed measurement is not cached
and falls back to the shipped curve."""

from __future__ import annotations

import pytest
import torch

from engine.instruments import floor_probe
from telemetry.floor import BandwidthCurve

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU


def _curve(method=f"fake {floor_probe.READ_METHOD}"):
    return BandwidthCurve("Test GPU", ((1 << 20, 1e11), (1 << 30, 4e12)), 4.1e12, method=method)


class Fake:
    def __init__(self, result):
        self.result, self.calls = result, []

    def __call__(self, device, budget_s):
        self.calls.append(budget_s)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_nothing_on_a_cpu(tmp_path):
    fake = Fake(_curve())
    assert floor_probe.engine_curve(torch.device("cpu"), cache_dir=tmp_path,
                                    measure=fake) is None
    assert fake.calls == []


def test_measured_once_within_the_budget_then_read_from_the_cache(tmp_path):
    fake = Fake(_curve())
    got = floor_probe.engine_curve(CUDA, cache_dir=tmp_path, gpu_name="Test GPU",
                                   measure=fake, budget_s=2.5)
    assert got == _curve() and fake.calls == [2.5]
    assert (tmp_path / "test-gpu.json").is_file()
    again = floor_probe.engine_curve(CUDA, cache_dir=tmp_path, gpu_name="Test GPU",
                                     measure=fake)
    assert again == _curve() and fake.calls == [2.5]  # not measured twice


def test_a_cached_curve_of_the_old_method_is_measured_again(tmp_path):
    """A cache written by the first probe (one read timed alone: small reads came out slower
    than the model's own kernels read) is replaced by a measurement of the current method."""
    from telemetry.floor import save_curve

    save_curve(_curve("sum(bf16->fp32) after a 256 MB L2 flush, CUDA events, median of 5"),
               tmp_path / "test-gpu.json")
    fake = Fake(_curve())
    got = floor_probe.engine_curve(CUDA, cache_dir=tmp_path, gpu_name="Test GPU",
                                   measure=fake, budget_s=2.0)
    assert got == _curve() and fake.calls == [2.0]
    again = floor_probe.engine_curve(CUDA, cache_dir=tmp_path, gpu_name="Test GPU",
                                     measure=fake)
    assert again == _curve() and fake.calls == [2.0]


@pytest.mark.parametrize("shipped", [True, False])
def test_a_partial_measurement_is_not_cached(tmp_path, monkeypatch, shipped):
    ship = _curve("shipped")
    monkeypatch.setattr(floor_probe, "load_curve", lambda gpu: ship if shipped else None)
    partial = _curve(f"fake; {floor_probe.PARTIAL} (budget 3 s)")
    got = floor_probe.engine_curve(CUDA, cache_dir=tmp_path, gpu_name="Test GPU",
                                   measure=Fake(partial))
    assert got == (ship if shipped else partial)
    assert not (tmp_path / "test-gpu.json").exists()


def test_a_failed_measurement_falls_back_to_the_shipped_curve(tmp_path, monkeypatch):
    ship = _curve("shipped")
    monkeypatch.setattr(floor_probe, "load_curve", lambda gpu: ship)
    got = floor_probe.engine_curve(CUDA, cache_dir=tmp_path, gpu_name="Test GPU",
                                   measure=Fake(RuntimeError("CUDA out of memory")))
    assert got == ship and not (tmp_path / "test-gpu.json").exists()


@pytest.mark.cuda
def test_on_cuda_engine_start_measures_every_size_and_caches_it(tmp_path):
    import time

    t = time.perf_counter()
    curve = floor_probe.engine_curve(CUDA, cache_dir=tmp_path)
    took = time.perf_counter() - t
    print(f"floor probe: {took:.2f} s; " + ", ".join(
        f"{b >> 20} MB {bw / 1e12:.2f} TB/s" for b, bw in curve.points))
    assert curve is not None and floor_probe.PARTIAL not in curve.method
    assert [b >> 20 for b, _ in curve.points] == list(floor_probe.SIZES_MB)
    # small reads never reach the large ones' bandwidth (the point of a size-aware floor)
    assert curve.points[0][1] < curve.points[-1][1]
    assert list(tmp_path.glob("*.json"))
    # a budget already spent still measures the first size, and is marked partial
    short = floor_probe.measure_curve(CUDA, budget_s=0.0)
    assert len(short.points) == 1 and floor_probe.PARTIAL in short.method
