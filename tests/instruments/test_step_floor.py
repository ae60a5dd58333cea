"""A step's byte floor and separate-kernel reference from the engine's start-up curve
(Engine.floor_curve), the step anatomy's summary showing each recorded step against both, and
the shipped anatomy read under the reference's name whatever key it was written with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.instruments.anatomy import AnatomyRecording, anatomy_summary
from engine.instruments.step_floor import engine_step_floors, step_floor, weight_reads
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


def test_the_floor_and_the_separate_kernel_reference_of_a_step_from_its_reads():
    weights = [64 * MB, MB]
    f = step_floor(weights, kv_bytes_per_token=4 * 1024, layers=2, contexts=[100, 156],
                   curve=CURVE)
    kv_read = 1024 * 256  # one layer's K (or V) of one token, times the batch's context
    total = 65 * MB + 4 * kv_read
    assert f["floor_bytes"] == total
    assert f["peak_floor_us"] == pytest.approx(total / 2e12 * 1e6)
    # the 64 MB tensor at 1 TB/s, the 1 MB one and each sub-MB KV read at 0.1 TB/s
    want = (64 * MB / 1e12 + MB / 1e11 + 4 * kv_read / 1e11) * 1e6
    assert f["separate_kernel_reference_us"] == pytest.approx(want)


def test_engine_step_floors_need_a_curve_and_read_contexts_from_the_records():
    rec = SimpleNamespace(step=5, chunks=[("a", 1, 100), ("b", 1, 156)])
    eng = SimpleNamespace(floor_curve=CURVE, model=_Tiny(False), kv_bytes_per_token=4 * 1024)
    floors = engine_step_floors(eng, [rec, SimpleNamespace(step=6, chunks=[])])
    assert list(floors) == [5]
    assert floors[5]["floor_bytes"] == 16_384 + 256_000 + 4 * 1024 * 256
    assert engine_step_floors(SimpleNamespace(floor_curve=None, model=eng.model,
                                              kv_bytes_per_token=4096), [rec]) == {}


def test_the_anatomy_summary_puts_each_step_against_the_floor_and_the_reference():
    steps = [StepKernels(5, [Kernel("nvjet_gemm", "gemm", 0.0, 80.0),
                             Kernel("paged_attention", "attention", 82.0, 18.0)])]
    floors = {5: {"floor_bytes": 1000, "peak_floor_us": 50.0,
                  "separate_kernel_reference_us": 80.0}}
    rec = AnatomyRecording(1, "", [], steps, 5, "cuda", 0.1, None, floors)
    row = anatomy_summary(rec)["steps"][0]
    assert row["x_peak_floor"] == pytest.approx(2.0)  # 100 us first to last kernel
    assert row["x_separate_kernel_reference"] == pytest.approx(1.25)
    from ui.figures.anatomy import step_rows

    shown = step_rows(anatomy_summary(rec))[0]
    assert shown["x peak-copy floor"] == 2.0 and shown["x separate-kernel reference"] == 1.25
    assert not any("floor" in k and "peak" not in k and "byte" not in k for k in shown)
    rec.floors = {}
    assert "x_separate_kernel_reference" not in anatomy_summary(rec)["steps"][0]


def test_a_shipped_anatomy_with_the_former_key_shows_the_separate_kernel_reference(tmp_path):
    """The shipped H200 anatomy JSON carries the reference under its former key: it loads and
    the page shows it as the separate-kernel reference, the byte floor staying "the floor"."""
    import json

    from ui.figures.anatomy import SHIPPED_ANATOMY, load_shipped_anatomy, shipped_rows

    doc = json.loads(SHIPPED_ANATOMY.read_text())
    shape = doc["results"]["shapes"]["32"]
    assert "size_aware_floor_us" in shape  # the shipped file as written
    shape["size_aware_floor_us"] = shape["floor_us"] * 2
    path = tmp_path / "anatomy.json"
    path.write_text(json.dumps(doc))
    loaded = load_shipped_anatomy(path)
    assert loaded is not None
    got = loaded["results"]["shapes"]["32"]
    assert "size_aware_floor_us" not in got
    assert got["separate_kernel_reference_us"] == shape["floor_us"] * 2
    row = next(r for r in shipped_rows(loaded) if r["batch"] == 32)
    assert row["x separate-kernel reference"] == pytest.approx(row["x floor"] / 2, abs=0.01)
    assert row["byte floor (us)"] == round(shape["floor_us"], 1)
    assert load_shipped_anatomy() is not None  # the shipped file itself still loads


def test_the_separate_kernel_reference_has_one_name():
    """No figure, label or doc calls the separate-kernel reference a floor: its former name
    lives only in the shipped recordings and in the one place that reads them."""
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    former = re.compile(r"size[-_ ]aware", re.IGNORECASE)
    allowed = {"telemetry/floor.py", "tests/instruments/test_step_floor.py"}
    files = subprocess.run(["git", "ls-files", "bench", "telemetry", "engine", "ui",
                            "docs", "tests", "README.md", "config.yaml"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        if name in allowed or name.startswith("docs/recordings/") or name.endswith(".png"):
            continue
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1)
                  if former.search(line)]
    assert found == []
    floor_src = (root / "telemetry/floor.py").read_text()
    assert len(former.findall(floor_src)) == 2  # the two former keys, read as the new ones


def test_the_live_floor_is_the_weights_and_the_context_s_kv_at_peak_copy():
    """StepRecord.floor_ns, the waterfall's byte floor on the Live page and /metrics: the
    weights once plus the KV of the step's total context, at the curve's peak copy rate
    (not the separate-kernel reference, which can lie above a measured step: a graph's
    kernels overlap)."""
    from engine.instruments.step_floor import live_floor

    f = live_floor(_Tiny(False), 4096, CURVE)
    assert f(0) == int(272_384 / 2e12 * 1e9)
    assert f(1000) == int((272_384 + 4096 * 1000) / 2e12 * 1e9)
    assert live_floor(_Tiny(False), 4096, None) is None  # a CPU: no curve, no floor
    no_copy = BandwidthCurve("Test GPU", ((MB, 1e11),))
    assert live_floor(_Tiny(False), 4096, no_copy) is None


def test_an_engine_with_a_curve_publishes_each_step_s_byte_floor(tiny_model_dir, monkeypatch):
    """The loop sets every published record's floor_ns from its chunks' contexts; without a
    curve (a CPU) it stays 0 and the waterfall's floor part with it."""
    from engine import Engine, EngineConfig, SamplingParams
    from engine import engine as engine_module
    from engine.instruments.step_floor import live_floor, weight_reads
    from telemetry.collect import StepCollector
    from telemetry.waterfall import waterfall

    def run(curve):
        monkeypatch.setattr(engine_module, "engine_curve", lambda device: curve)
        eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", dtype="float32",
                                  max_num_seqs=2, max_num_batched_tokens=32, num_blocks=64,
                                  block_size=16, async_batching=False, cuda_graphs=False))
        try:
            with StepCollector(eng.bus) as col:
                eng.generate([[1, 2, 3, 4], [5, 6, 7]], SamplingParams(max_tokens=4,
                                                                        temperature=0.0,
                                                                        ignore_eos=True))
            return eng, [r for r in col.records if r.num_tokens]
        finally:
            eng.shutdown()

    eng, recs = run(CURVE)
    assert recs
    weights = sum(weight_reads(eng.model))
    for r in recs:
        ctx = sum(c[2] for c in r.chunks)
        assert r.floor_ns == int((weights + eng.kv_bytes_per_token * ctx) / 2e12 * 1e9) > 0
    assert live_floor(eng.model, eng.kv_bytes_per_token, CURVE)(7) == recs[0].floor_ns
    _, plain = run(None)
    assert plain and all(r.floor_ns == 0 for r in plain)
    assert waterfall(plain, 0, 1 << 62).parts_ns["floor"] is None  # no samples: unknown
