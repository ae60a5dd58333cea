"""The token budget (max_num_batched_tokens) as a live setting: refused outside the range the
engine was started for with a message saying that range and why, versioned like the other
live settings, applied at a step boundary (every later step is scheduled within it, and
greedy tokens stay those of a run that never changed it)."""

from __future__ import annotations

import pytest
from engine_checks import assert_all_blocks_free, mixed_prompts

from engine import Engine, EngineConfig, SamplingParams
from engine.config import token_budget_range

MAX_NEW = 10
SEQS = 4
BUDGET = 48  # the configured (allocated) budget: prompts of up to 70 tokens need chunks


def make_engine(model_dir, **settings) -> Engine:
    cfg = EngineConfig(model=str(model_dir), device="cpu", max_num_seqs=SEQS,
                       max_num_batched_tokens=BUDGET, block_size=4, max_model_len=96,
                       **settings)
    return Engine(cfg, start=False)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = make_engine(tiny_model_dir("llama"))
    yield eng
    eng.shutdown()


def test_the_range_is_max_num_seqs_to_the_configured_budget():
    assert token_budget_range(512, 16) == (16, 512)
    assert token_budget_range(8, 16) == (8, 8)  # a budget below max_num_seqs stays as it is


@pytest.mark.parametrize(("bad", "says"), [
    (BUDGET + 1, f"from {SEQS} to {BUDGET} while the engine runs, got {BUDGET + 1}: at most "
                 f"the {BUDGET} it was started with"),
    (SEQS - 1, f"at least max_num_seqs ({SEQS}), so every running request gets a token"),
    (0, "max_num_batched_tokens must be an integer >= 1, got 0"),
    (32.0, "max_num_batched_tokens must be an integer >= 1, got 32.0"),
    (True, "max_num_batched_tokens must be an integer >= 1, got True"),
])
def test_a_budget_outside_the_range_is_refused_and_nothing_changes(engine, bad, says):
    before = engine.settings()
    with pytest.raises(ValueError) as err:
        engine.configure(max_num_batched_tokens=bad)
    assert says in str(err.value)
    assert engine.settings() == before  # neither the budget nor the version moved
    # The engine serves on.
    out = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0.0))
    assert len(out[0].token_ids) == 2


def test_a_budget_change_is_versioned_and_reported(engine):
    first = engine.settings()
    assert first["max_num_batched_tokens"] == BUDGET
    assert first["max_num_batched_tokens_range"] == [SEQS, BUDGET]
    after = engine.configure(max_num_batched_tokens=16)
    assert after["max_num_batched_tokens"] == 16
    assert after["settings_version"] == first["settings_version"] + 1
    same = engine.configure(max_num_batched_tokens=16)  # no change: no new version
    assert same["settings_version"] == after["settings_version"]
    back = engine.configure(max_num_batched_tokens=BUDGET)
    assert back["settings_version"] == after["settings_version"] + 1


def _run(model_dir, prompts, change_at: int | None, budget: int, async_batching: bool):
    """Greedy outputs of ``prompts`` stepped by hand, the budget set to ``budget`` after
    ``change_at`` steps (never, when None), and every step's record."""
    with make_engine(model_dir, async_batching=async_batching) as eng:
        handles = [eng.submit(p, SamplingParams(max_tokens=MAX_NEW, temperature=0.0,
                                                ignore_eos=True)) for p in prompts]
        steps = 0
        while not all(h.done for h in handles):
            if steps == change_at:
                eng.configure(max_num_batched_tokens=budget)
            eng.step()
            steps += 1
        records = eng.bus.snapshot_steps(10_000)
        assert_all_blocks_free(eng)
        return [h.result().token_ids for h in handles], records


@pytest.mark.parametrize("async_batching", [False, True])
def test_a_new_budget_holds_from_the_next_step_and_tokens_stay_the_same(tiny_model_dir,
                                                                        async_batching):
    model_dir = tiny_model_dir("llama")
    prompts = mixed_prompts(6, seed=3)
    expected, _ = _run(model_dir, prompts, None, BUDGET, async_batching)
    change_at = 3
    tokens, records = _run(model_dir, prompts, change_at, SEQS, async_batching)
    assert tokens == expected
    before = [r for r in records if r.step < change_at]
    after = [r for r in records if r.step >= change_at]
    assert before and after
    assert {r.token_budget for r in before} == {BUDGET}
    assert {r.token_budget for r in after} == {SEQS}
    # The steps before the change filled the large budget; none after it exceeds the new one.
    assert max(r.num_tokens for r in before) > SEQS
    assert max(r.num_tokens for r in after) <= SEQS
