"""Engine.run_on_loop: a caller's function runs on the loop thread at a step boundary (how the
truth suite starts and stops torch.profiler without racing the loop's launches); its result or
exception comes back to the caller, and the engine serves on."""

from __future__ import annotations

import threading

import pytest

from engine import Engine, EngineConfig, SamplingParams

RAW = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, detokenize=False)
CFG = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=32, block_size=4,
           num_blocks=64, max_model_len=64)


def test_run_on_loop_runs_on_the_loop_thread_between_steps(tiny_model_dir):
    with Engine(EngineConfig(model=str(tiny_model_dir("llama")), **CFG)) as eng:
        before = eng.submit([3, 4, 5], RAW).result(60).token_ids
        h = eng.submit([9, 8, 7], SamplingParams(max_tokens=40, temperature=0.0,
                                                 ignore_eos=True, detokenize=False))
        seen = eng.run_on_loop(lambda: (threading.current_thread().name,
                                        eng.loop.step_no))
        assert seen[0] != threading.current_thread().name  # not the caller's thread
        assert seen[0] == eng._thread.name and isinstance(seen[1], int)

        def boom():
            raise ValueError("from the loop")
        with pytest.raises(ValueError, match="from the loop"):
            eng.run_on_loop(boom)
        assert len(h.result(60).token_ids) == 40  # the request in flight went on
        assert eng.submit([3, 4, 5], RAW).result(60).token_ids == before


def test_run_on_loop_without_a_loop_thread_runs_here(tiny_model_dir):
    with Engine(EngineConfig(model=str(tiny_model_dir("llama")), **CFG), start=False) as eng:
        assert eng.run_on_loop(lambda: threading.current_thread().name) == \
            threading.current_thread().name
