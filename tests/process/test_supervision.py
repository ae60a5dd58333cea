"""The restart policy `engine serve` and the dashboard share (engine/process/supervision.py):
no restart while the engine answers, backoff between failed attempts with a crash loop given
up, and a restart that puts back the live settings and the load generator. A stand-in client:
no engine process."""

from __future__ import annotations

from typing import Any

import pytest

from engine.process.supervision import (
    MAX_BACKOFF_S,
    Backoff,
    Kept,
    RestartRefused,
    check_restart_wanted,
    restart_keeping,
)


class StandIn:
    """Alive or dead, a generation per start, and the live settings it was configured with."""

    def __init__(self, alive: bool = False, graphs: bool = True) -> None:
        self.running = alive
        self.generation = 1
        self.graphs = graphs
        self.budget_range = [16, 512]  # max_num_seqs .. the configured max_num_batched_tokens
        self.live: dict[str, Any] = {"async_batching": True, "num_slots": 2,
                                     "cuda_graphs": False, "sentinel_sample_every": 0,
                                     "max_num_batched_tokens": 512}
        self.loads: list[Any] = []

    def alive(self) -> bool:
        return self.running

    def restart(self) -> None:
        self.generation += 1
        self.running = True
        self.live = {"async_batching": True, "num_slots": 2, "cuda_graphs": False,
                     "sentinel_sample_every": 0,
                     "max_num_batched_tokens": self.budget_range[1]}  # the config's values

    def settings(self) -> dict[str, Any]:
        return {**self.live, "cuda_graphs_available": self.graphs,
                "max_num_batched_tokens_range": list(self.budget_range)}

    def configure(self, origin: str | None = None, **live: Any) -> dict[str, Any]:
        if live.get("cuda_graphs") and not self.graphs:
            raise ValueError("cuda_graphs cannot be turned on: no CUDA device")
        budget = live.get("max_num_batched_tokens")
        if budget is not None and not self.budget_range[0] <= budget <= self.budget_range[1]:
            raise ValueError(f"max_num_batched_tokens must be an integer from "
                             f"{self.budget_range[0]} to {self.budget_range[1]}")
        self.live.update(live)
        return self.settings()

    def start_load(self, spec: Any) -> None:
        self.loads.append(spec)


def test_no_restart_while_the_engine_answers() -> None:
    with pytest.raises(RestartRefused, match="the engine is running"):
        check_restart_wanted(StandIn(alive=True))
    check_restart_wanted(StandIn(alive=False))  # a dead engine may be restarted


def test_a_kill_is_refused_once_the_engine_answers_again_or_was_restarted() -> None:
    hung = StandIn(alive=True)
    with pytest.raises(RestartRefused, match="answers again"):
        check_restart_wanted(hung, seen_generation=1, hung=True, answers=lambda: True)
    check_restart_wanted(hung, seen_generation=1, hung=True, answers=lambda: False)
    hung.generation = 2
    with pytest.raises(RestartRefused, match="already restarted"):
        check_restart_wanted(hung, seen_generation=1, hung=True, answers=lambda: False)


def test_backoff_doubles_to_its_cap_and_a_crash_loop_is_given_up() -> None:
    now = [0.0]
    b = Backoff(max_restarts=7, backoff_s=4.0, window_s=60.0, clock=lambda: now[0])
    assert list(b.delays()) == [4.0, 8.0, 16.0, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S,
                                MAX_BACKOFF_S]
    assert all(b.died() for _ in range(7))
    assert not b.died()  # the eighth death within the window
    now[0] = 100.0  # the old deaths leave the window
    assert b.died()


def test_a_restart_puts_back_the_live_settings_and_the_load() -> None:
    client = StandIn(alive=False)
    kept = Kept()
    kept.remember({**client.settings(), "async_batching": False, "num_slots": 3,
                   "cuda_graphs": True, "sentinel_sample_every": 64})
    kept.remember_load({"running": True, "spec": {"concurrency": None, "rate": 5.0}})
    settings = restart_keeping(client, kept, origin="a test")
    assert (settings["async_batching"], settings["num_slots"], settings["cuda_graphs"],
            settings["sentinel_sample_every"]) == (False, 3, True, 64)
    assert len(client.loads) == 1 and client.loads[0].rate == 5.0


def test_graphs_are_left_off_where_the_new_engine_has_none() -> None:
    client = StandIn(alive=False, graphs=False)
    kept = Kept()
    kept.remember({"async_batching": False, "num_slots": 1, "cuda_graphs": True,
                   "cuda_graphs_available": True})
    settings = restart_keeping(client, kept, origin="a test")
    assert (settings["async_batching"], settings["num_slots"], settings["cuda_graphs"]) == \
        (False, 1, False)


def test_a_restart_keeps_the_token_budget() -> None:
    client = StandIn(alive=False)
    kept = Kept()
    kept.remember({**client.settings(), "max_num_batched_tokens": 64, "settings_version": 3})
    settings = restart_keeping(client, kept, origin="a test")
    assert settings["max_num_batched_tokens"] == 64


def test_a_budget_the_restarted_engine_cannot_take_is_left_at_its_own() -> None:
    """An engine restarted with a smaller max_num_batched_tokens keeps its own budget, and the
    other kept settings still come back."""
    client = StandIn(alive=False)
    kept = Kept()
    kept.remember({**client.settings(), "max_num_batched_tokens": 512, "num_slots": 3})
    client.budget_range = [16, 256]
    settings = restart_keeping(client, kept, origin="a test")
    assert (settings["max_num_batched_tokens"], settings["num_slots"]) == (256, 3)
