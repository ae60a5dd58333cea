"""The byte floor of a decode step from a model's shape, and the separate-kernel reference from
a measured bandwidth curve (telemetry.floor), as `python -m bench anatomy` and async-vs-sync
compute them."""

from __future__ import annotations

import pytest
import torch

from bench.harness import floor
from bench.harness.shapes import build_model


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", torch.device("cpu"), torch.float32)


def test_weights_and_kv_bytes_follow_the_shape(tiny):
    f = floor.ByteFloor.of(tiny, bandwidth=1e9)
    emb = tiny.get_input_embeddings().weight
    every = sum(p.numel() * 4 for p in tiny.parameters())
    assert f.weight_bytes == every - emb.numel() * 4  # the embedding table is not read
    # tiny: 2 layers x 2 kv heads x head_dim 16, K and V, float32
    assert f.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert f.step_bytes(4, 100) == f.weight_bytes + 4 * 100 * f.kv_bytes_per_token
    assert f.step_seconds(4, 100) == pytest.approx(f.step_bytes(4, 100) / 1e9)
    assert sum(f.reads(4, 100)) == f.step_bytes(4, 100)
    # the context grows by one token each decode step
    assert f.decode_seconds(4, 100, 3) == pytest.approx(
        sum(f.step_seconds(4, 100 + i) for i in range(3)))


def test_separate_kernel_reference_reads_each_tensor_at_its_sizes_bandwidth(tiny, monkeypatch):
    curves = pytest.importorskip("telemetry.floor")
    curve = curves.BandwidthCurve("Test GPU", ((1_000, 1e6), (1_000_000, 1e9)))
    monkeypatch.setattr(curves, "load_curve", lambda gpu: curve if gpu == "Test GPU" else None)
    reads = [1_000, 1_000_000]
    assert floor.separate_kernel_seconds(reads, "Test GPU") == pytest.approx(1e-3 + 1e-3)
    assert floor.separate_kernel_seconds(reads, "Other GPU") is None  # no curve: no column
    assert floor.separate_kernel_seconds(reads, None) is None  # off a GPU
