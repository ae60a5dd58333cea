"""The floor curve is a property of the GPU: measured once per GPU model, driver and torch
version and cached on disk, read from that cache at every later engine start (a new driver or
torch measures again); nothing on a CPU; a partial or failed measurement is not cached and
falls back to the shipped curve. CPU tests with a fake measurement, and one on CUDA."""

from __future__ import annotations

import pytest
import torch

from engine.instruments import floor_probe
from telemetry.floor import BandwidthCurve, GpuIdentity, cache_path, save_curve

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU
GPU = GpuIdentity("Test GPU", "550.54.15", "2.11.0+cu130")


def _curve(method=f"fake {floor_probe.READ_METHOD}"):
    return BandwidthCurve("Test GPU", ((1 << 20, 1e11), (1 << 30, 4e12)), 4.1e12, method=method)


class Fake:
    def __init__(self, result):
        self.result, self.calls = result, 0

    def __call__(self, device):
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def _start(tmp_path, fake, ident=GPU):
    """What an engine start does for its curve."""
    return floor_probe.engine_curve(CUDA, cache_dir=tmp_path, identity=ident, measure=fake)


def test_nothing_on_a_cpu(tmp_path):
    fake = Fake(_curve())
    assert floor_probe.engine_curve(torch.device("cpu"), cache_dir=tmp_path,
                                    measure=fake) is None
    assert fake.calls == 0


def test_measured_at_the_first_start_only_then_read_from_the_cache(tmp_path):
    fake = Fake(_curve())
    assert _start(tmp_path, fake) == _curve() and fake.calls == 1
    assert cache_path(GPU, tmp_path).is_file()
    for _ in range(3):  # later engine starts, other processes: no measurement
        assert _start(tmp_path, fake) == _curve()
    assert fake.calls == 1


@pytest.mark.parametrize("changed", [
    GpuIdentity("Test GPU", "560.28.03", GPU.torch),   # a driver update
    GpuIdentity("Test GPU", GPU.driver, "2.12.0+cu130"),  # a torch update
    GpuIdentity("Other GPU", GPU.driver, GPU.torch),  # another GPU model
])
def test_another_driver_torch_or_gpu_is_measured_again(tmp_path, changed):
    fake = Fake(_curve())
    _start(tmp_path, fake)
    assert _start(tmp_path, fake, changed) == _curve() and fake.calls == 2
    assert cache_path(changed, tmp_path) != cache_path(GPU, tmp_path)
    assert _start(tmp_path, fake, changed) == _curve() and fake.calls == 2  # cached too


def test_the_cache_path_is_a_plain_file_name(tmp_path):
    path = cache_path(GpuIdentity("NVIDIA H200", "cuda-13000", "2.11.0+cu130"), tmp_path)
    assert path.name == "nvidia-h200--driver-cuda-13000--torch-2-11-0-cu130.json"
    assert path.parent == tmp_path


def test_an_engine_start_caches_under_the_folder_gapless_cache_names(tmp_path, monkeypatch):
    from engine import envs

    monkeypatch.setenv(envs.GAPLESS_CACHE, str(tmp_path))
    assert floor_probe.default_cache_dir() == tmp_path / "floor"
    fake = Fake(_curve())
    assert floor_probe.engine_curve(CUDA, identity=GPU, measure=fake) == _curve()
    assert cache_path(GPU, tmp_path / "floor").is_file()
    assert floor_probe.engine_curve(CUDA, identity=GPU, measure=fake) == _curve()
    assert fake.calls == 1


def test_a_cached_curve_of_the_old_method_is_measured_again(tmp_path):
    """A cache written by another method (one read timed alone: small reads come out slower
    than the model's own kernels read them) is replaced by a measurement of the current one."""
    save_curve(_curve("sum(bf16->fp32) after a 256 MB L2 flush, CUDA events, median of 5"),
               cache_path(GPU, tmp_path))
    fake = Fake(_curve())
    assert _start(tmp_path, fake) == _curve() and fake.calls == 1
    assert _start(tmp_path, fake) == _curve() and fake.calls == 1


def test_an_unreadable_cache_is_measured_again(tmp_path):
    path = cache_path(GPU, tmp_path)
    path.write_text("{not json")
    fake = Fake(_curve())
    assert _start(tmp_path, fake) == _curve() and fake.calls == 1
    assert floor_probe.load_curve_file(path) == _curve()


@pytest.mark.parametrize("shipped", [True, False])
def test_a_partial_measurement_is_not_cached(tmp_path, monkeypatch, shipped):
    ship = _curve("shipped")
    monkeypatch.setattr(floor_probe, "load_curve", lambda gpu: ship if shipped else None)
    partial = _curve(f"fake; {floor_probe.PARTIAL} (budget 3 s)")
    assert _start(tmp_path, Fake(partial)) == (ship if shipped else partial)
    assert not cache_path(GPU, tmp_path).exists()


def test_a_failed_measurement_falls_back_to_the_shipped_curve(tmp_path, monkeypatch):
    ship = _curve("shipped")
    monkeypatch.setattr(floor_probe, "load_curve", lambda gpu: ship)
    assert _start(tmp_path, Fake(RuntimeError("CUDA out of memory"))) == ship
    assert not cache_path(GPU, tmp_path).exists()


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
    # small reads never reach the large ones' bandwidth (what the separate-kernel reference prices)
    assert curve.points[0][1] < curve.points[-1][1]
    assert cache_path(floor_probe.gpu_identity(CUDA), tmp_path).is_file()
    # a budget already spent still measures the first size, and is marked partial
    short = floor_probe.measure_curve(CUDA, budget_s=0.0)
    assert len(short.points) == 1 and floor_probe.PARTIAL in short.method
