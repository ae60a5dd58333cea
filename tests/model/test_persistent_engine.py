"""`fused_layer: persistent` through the engine (issue 22): greedy tokens against
transformers', with the tight caches that force chunked prefill and preemption.

- CPU without the interpreter: the mode falls back to the five layer's torch twins for every
  forward (Triton cannot run), and says so in settings().
- Interpreter (CPU, fp32, ``test_interp_*`` in the TRITON_INTERPRET=1 child): the real kernel,
  phase by phase, for every step of at most MAX_TOKENS tokens (every step of the tight config;
  with MAX_TOKENS lowered to 4, steps above it run the five layer, so both paths hand the
  hidden state over in the same convention): tokens equal generate's exactly.
- CUDA (bf16): the one-launch kernel with its barriers, graphs off and on: each token is
  transformers' fp32 argmax given the tokens before it, up to a bf16 tie (as for `five`, whose
  tiles it runs: tests/model/test_fused_rope_engine.py says why not exact).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_fused_ops import IN_INTERPRETER, interp_only, needs_cuda, run_interpreter_child
from test_persistent_layer import count_launches

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "engine"))


@pytest.mark.slow
@pytest.mark.skipif(IN_INTERPRETER, reason="this is the parent of the interpreter run")
def test_persistent_engine_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert re.search(r"\b2 passed", proc.stdout) and "skipped" not in proc.stdout, report


@pytest.mark.skipif(IN_INTERPRETER, reason="the torch path, not the interpreter")
def test_cpu_falls_back_to_five_and_greedy_equals_generate(tmp_path, monkeypatch) -> None:
    from helpers import TIGHT_CPU, hf_greedy, mixed_prompts
    from tiny_models import save_tiny_model

    from engine import Engine, EngineConfig, SamplingParams
    from engine.model import fused_rope
    from engine.model.persistent_step import SUMMARY

    launches = count_launches(monkeypatch)
    calls = []
    real = fused_rope.fused_qkv_rope_torch
    monkeypatch.setattr(fused_rope, "fused_qkv_rope_torch",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    model_dir = save_tiny_model("llama", tmp_path)
    prompts = mixed_prompts(9)
    expected = hf_greedy(model_dir, prompts, 12)
    cfg = EngineConfig(model=str(model_dir), **{**TIGHT_CPU, "fused_layer": "persistent"})
    with Engine(cfg) as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0,
                                                    ignore_eos=True))
        stats, settings = eng.stats(), eng.settings()
    assert settings["fused_layer"] == SUMMARY
    assert not launches and calls, "on the CPU the five layer's torch twins run"
    assert stats["preemptions"] > 0
    assert [o.token_ids for o in outs] == expected


@interp_only
@pytest.mark.parametrize("max_tokens", [64, 4])
def test_interp_engine_persistent_kernel_greedy_equals_generate(max_tokens, tmp_path,
                                                                monkeypatch):
    """The real kernel (interpreter, fp32, one launch a phase) inside the engine: greedy
    tokens equal generate's. The fallback layers and the other ops run their torch twins."""
    from helpers import cpu_engine_outputs, hf_greedy, mixed_prompts
    from tiny_models import save_tiny_model

    from engine.model import fused_gemm, fused_ops, fused_rope, persistent_step

    monkeypatch.setattr(persistent_step, "MAX_TOKENS", max_tokens)
    for mod in (fused_ops, fused_gemm, fused_rope):
        monkeypatch.setattr(mod, "use_triton", lambda x: False)
    fallback = []
    real = fused_rope.fused_qkv_rope_torch
    monkeypatch.setattr(fused_rope, "fused_qkv_rope_torch",
                        lambda *a, **k: fallback.append(1) or real(*a, **k))
    launches = count_launches(monkeypatch)
    model_dir = save_tiny_model("llama", tmp_path)
    prompts = mixed_prompts(9, seed=5)
    expected = hf_greedy(model_dir, prompts, 12)
    tokens, stats = cpu_engine_outputs(model_dir, prompts, 12, fused_layer="persistent",
                                       block_size=16, num_blocks=9)
    assert launches and set(launches) == {(p, p, False) for p in range(5)}
    assert bool(fallback) == (max_tokens < 16), "steps above MAX_TOKENS run the five layer"
    assert stats["preemptions"] > 0
    assert tokens == expected


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize(("graphs", "whole"), [(False, False), (True, False), (True, True)])
def test_cuda_persistent_greedy_within_ties(graphs, whole, tiny_model_dir, monkeypatch):
    """bf16, the tight CUDA cache (preemption), every step (16 tokens at most) on the
    one-launch kernel, or with `whole` on one launch for all layers
    (GAPLESS_PERSISTENT_MODEL=1): tokens within bf16 ties of transformers' fp32 argmax; the
    kernels ran with their barriers, which never timed out."""
    from helpers import cuda_engine_outputs, mixed_prompts
    from test_fused_rope_engine import greedy_within_ties

    from engine.model import persistent_barrier, persistent_step

    monkeypatch.setenv(persistent_step.WHOLE_MODEL_ENV, "1" if whole else "0")
    whole_runs = []
    real_whole = persistent_step.persistent_model
    monkeypatch.setattr(persistent_step, "persistent_model",
                        lambda *a, **k: whole_runs.append(real_whole(*a, **k)) or whole_runs[-1])
    counters = []
    monkeypatch.setattr(persistent_step, "new_counter",
                        lambda dev: counters.append(persistent_barrier.new_counter(dev))
                        or counters[-1])
    launches = count_launches(monkeypatch)
    model_dir = tiny_model_dir("llama")
    prompts = mixed_prompts(9, seed=5)
    got, stats, settings = cuda_engine_outputs(model_dir, prompts, 12, async_batching=False,
                                               cuda_graphs=graphs, model_impl="gapless",
                                               fused_layer="persistent")
    assert settings["fused_layer"].startswith("persistent")
    assert set(launches) <= {(0, 4, True)}
    assert (launches and not whole_runs) if not whole else (whole_runs and all(whole_runs)
                                                            and not launches)
    assert counters and not any(persistent_barrier.timed_out(c) for c in counters)
    assert stats["preemptions"] > 0
    assert [len(t) for t in got] == [12] * len(prompts)
    ties = greedy_within_ties(model_dir, prompts, got, "cuda")
    print(f"persistent graphs={graphs} whole={whole}: ties forgiven (request, token, gap) {ties}")
