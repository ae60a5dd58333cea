"""`python -m bench gpu`'s runner: option routing to suites, budgets that end a part without
ending the call, and the parts' logs and summary."""

from __future__ import annotations

import json
import sys

import pytest

from bench import suites
from bench.harness import runner


def test_common_options_reach_only_suites_that_know_them():
    tokens = ["--preset", "tiny", "--batches=4,1", "--no-such-option", "x", "--device", "cpu"]
    assert runner.common_for("anatomy", tokens) == ["--preset", "tiny", "--batches=4,1",
                                                    "--device", "cpu"]


def test_pairs_and_unknown_suites_are_refused_clearly():
    assert runner.parse_pairs("anatomy=150, async-vs-sync=300", "--budget") == {
        "anatomy": "150", "async-vs-sync": "300"}
    with pytest.raises(SystemExit, match="SUITE=VALUE"):
        runner.parse_pairs("anatomy", "--budget")
    with pytest.raises(ValueError, match="unknown suite 'nope'.*anatomy"):
        suites.load("nope")
    with pytest.raises(SystemExit, match="not in --suites"):
        runner.main(["--suites", "anatomy", "--budget", "other=3"])


def test_a_part_that_fails_or_overruns_is_recorded_and_the_log_kept(tmp_path):
    ok = runner.run_part("ok", [sys.executable, "-c", "print('hello')"], tmp_path / "ok", 30)
    assert ok["status"] == "ok" and (tmp_path / "ok" / "log.txt").read_text() == "hello\n"
    bad = runner.run_part("bad", [sys.executable, "-c", "raise SystemExit(3)"],
                          tmp_path / "bad", 30)
    assert bad["status"] == "failed (exit 3)" and bad["returncode"] == 3
    slow = runner.run_part("slow", [sys.executable, "-c", "import time; time.sleep(60)"],
                           tmp_path / "slow", 1)
    assert slow["status"].startswith("timeout") and slow["seconds"] < 30


def test_gpu_call_writes_one_folder_with_every_part(tmp_path, monkeypatch):
    calls = []

    def fake_run_part(suite, cmd, out, budget):
        calls.append((suite, cmd, budget))
        return {"suite": suite, "status": "ok" if len(calls) == 1 else "failed (exit 1)",
                "returncode": 0, "seconds": 1.0, "command": " ".join(cmd), "out": str(out)}

    monkeypatch.setattr(runner, "run_part", fake_run_part)
    rc = runner.main(["--suites", "anatomy,anatomy", "--budget", "anatomy=5", "--args",
                      "anatomy=--steps 3", "--out", str(tmp_path), "--", "--preset", "tiny",
                      "--unknown"])
    assert rc == 1  # one part failed; the call still ran both
    assert [c[0] for c in calls] == ["anatomy", "anatomy"] and calls[0][2] == 5.0
    assert calls[0][1][-4:] == ["--preset", "tiny", "--steps", "3"]
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert [p["status"] for p in data["results"]] == ["ok", "failed (exit 1)"]
    assert "| anatomy | ok |" in (tmp_path / "gpu.md").read_text()
