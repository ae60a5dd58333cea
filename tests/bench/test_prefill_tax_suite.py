"""`python -m bench prefill-tax`'s options: the CPU default keeps the engine check's sizes,
``--device cuda`` takes the GPU's sizes and a random-weight shape (no model hub), and says
clearly where there is no CUDA; the random-weight path runs end to end on a CPU, and the
compute-span fit (the second row of a GPU's table) fits the steps' compute spans."""

from __future__ import annotations

import json

import pytest
import torch

from bench import suites
from bench.__main__ import main
from bench.suites import prefill_tax
from bench.suites.prefill_tax import CUDA_PRESET, DEFAULT_MODEL, SIZES, Plan, plan


def parse(*argv: str):
    return suites.parser("prefill-tax", prefill_tax).parse_args(list(argv))


def test_the_cpu_default_is_the_engine_checks_run():
    assert plan(parse()) == Plan("cpu", None, DEFAULT_MODEL, 6, 1000, 256, 1)


def test_cuda_takes_the_gpu_sizes_and_random_weights(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = SIZES["cuda"]
    assert plan(parse("--device", "cuda")) == Plan(
        "cuda", CUDA_PRESET, DEFAULT_MODEL, gpu.rounds, gpu.long_prompt, gpu.chunk, None)
    assert plan(parse("--device", "cuda", "--preset", "llama-1b", "--rounds", "3")).preset \
        == "llama-1b"
    own = plan(parse("--device", "cuda", "--model", "models/mine"))
    assert own.preset is None and own.model == "models/mine"


def test_cuda_without_a_gpu_is_refused_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"--device cuda needs a CUDA GPU.*--device cpu"):
        main(["prefill-tax", "--device", "cuda", "--out", str(tmp_path)])
    assert not list(tmp_path.glob("*.jsonl"))


@pytest.mark.parametrize("argv, says", [
    (("--preset", "tiny", "--model", "models/x"), "not both"),
    (("--rounds", "0"), "--rounds must be at least 1, got 0"),
    (("--chunk", "-4"), "--chunk must be at least 1"),
])
def test_bad_options_say_what_is_allowed(argv, says, tmp_path):
    with pytest.raises(SystemExit, match=says):
        prefill_tax.run(parse(*argv), tmp_path)
    with pytest.raises(SystemExit):  # argparse names the choices
        parse("--device", "tpu")


def test_the_random_weight_path_runs_on_a_cpu(tmp_path, capsys):
    assert main(["prefill-tax", "--device", "cpu", "--preset", "tiny", "--rounds", "2",
                 "--long-prompt", "300", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny shape, random float32 weights, sync, budget 264" in out
    assert "| decode + prefill + context |" in out and "(control)" in out
    assert "compute span" not in out  # the CPU's table is the engine check's
    lines = (tmp_path / "cpu-prefill-tax.jsonl").read_text().splitlines()
    meta = json.loads(lines[0])
    assert meta["model"] == "tiny shape, random float32 weights"
    assert meta["windows"][0]["label"] == "sync" and meta["graphs"] is False
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert summary["fit"]["chunk_steps"] >= 4 and "fit_compute" not in summary


def test_the_compute_fit_fits_the_compute_spans():
    scen = prefill_tax.run_scenario(rounds=2, long_prompt=300, fit_prompts=(300,),
                                    preset="tiny")
    period = prefill_tax.penalty_check(scen)
    compute = prefill_tax.penalty_check(scen, source="compute")
    assert compute.chunk_steps == period.chunk_steps >= 4
    # a step's compute span lies inside its period (which adds scheduling, preparation and
    # the tokens' delivery), so the compute fit predicts the chunk steps shorter
    assert compute.predicted_itl_ms < period.predicted_itl_ms, (compute, period)
