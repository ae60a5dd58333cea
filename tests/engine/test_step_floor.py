"""A step's byte floor from the engine's start-up curve (Engine.floor_curve), both ways, and
the step anatomy's summary showing each recorded step against both (issue 20)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.step.anatomy import AnatomyRecording, anatomy_summary
from engine.step.step_floor import engine_step_floors, step_floor, weight_reads
from telemetry.anatomy import Kernel, StepKernels
from telemetry.floor import BandwidthCurve

MB = 1 << 20
# 1 MB reads at 0.1 TB/s, 64 MB and up at 1 TB/s; copies at 2 TB/s
CURVE = BandwidthCurve("Test GPU", ((MB, 1e11), (64 * MB, 1e12)), peak_copy_bw=2e12)


class _Tiny(torch.nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 64)  # 256,000 bytes in fp32
        self.proj = torch.nn.Linear(64, 64, bias=False)  # 16,384 bytes
        self.lm_head = torch.nn.Linear(64, 1000, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight
        self.config = SimpleNamespace(num_hidden_layers=2)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed


@pytest.mark.parametrize("tied", [False, True])
def test_a_step_reads_each_weight_once_and_the_embedding_table_only_as_the_head(tied):
    reads = weight_reads(_Tiny(tied))
    # untied: proj and the head (the table's looked-up rows are not a floor's worth); tied:
    # the shared table once (as the head) and proj
    assert sorted(reads) == sorted([16_384, 256_000])


def test_both_floors_of_a_step_from_its_reads():
    weights = [64 * MB, MB]
    f = step_floor(weights, kv_bytes_per_token=4 * 1024, layers=2, contexts=[100, 156],
                   curve=CURVE)
    kv_read = 1024 * 256  # one layer's K (or V) of one token, times the batch's context
    total = 65 * MB + 4 * kv_read
    assert f["floor_bytes"] == total
    assert f["peak_floor_us"] == pytest.approx(total / 2e12 * 1e6)
    # the 64 MB tensor at 1 TB/s, the 1 MB one and each sub-MB KV read at 0.1 TB/s
    want = (64 * MB / 1e12 + MB / 1e11 + 4 * kv_read / 1e11) * 1e6
    assert f["size_aware_floor_us"] == pytest.approx(want)


def test_engine_step_floors_need_a_curve_and_read_contexts_from_the_records():
    rec = SimpleNamespace(step=5, chunks=[("a", 1, 100), ("b", 1, 156)])
    eng = SimpleNamespace(floor_curve=CURVE, model=_Tiny(False), kv_bytes_per_token=4 * 1024)
    floors = engine_step_floors(eng, [rec, SimpleNamespace(step=6, chunks=[])])
    assert list(floors) == [5]
    assert floors[5]["floor_bytes"] == 16_384 + 256_000 + 4 * 1024 * 256
    assert engine_step_floors(SimpleNamespace(floor_curve=None, model=eng.model,
                                              kv_bytes_per_token=4096), [rec]) == {}


def test_the_anatomy_summary_puts_each_step_against_both_floors():
    steps = [StepKernels(5, [Kernel("nvjet_gemm", "gemm", 0.0, 80.0),
                             Kernel("paged_attention", "attention", 82.0, 18.0)])]
    floors = {5: {"floor_bytes": 1000, "peak_floor_us": 50.0, "size_aware_floor_us": 80.0}}
    rec = AnatomyRecording(1, "", [], steps, 5, "cuda", 0.1, None, floors)
    row = anatomy_summary(rec)["steps"][0]
    assert row["x_peak_floor"] == pytest.approx(2.0)  # 100 us first to last kernel
    assert row["x_size_aware_floor"] == pytest.approx(1.25)
    from ui.anatomy import step_rows

    shown = step_rows(anatomy_summary(rec))[0]
    assert shown["x peak-copy floor"] == 2.0 and shown["x size-aware floor"] == 1.25
    rec.floors = {}
    assert "x_size_aware_floor" not in anatomy_summary(rec)["steps"][0]
