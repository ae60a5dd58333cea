"""The live token budget through a real engine process: set by a client (refused outside the
engine's range with its message), and put back after the engine was killed and restarted by
the restart policy the dashboard and `engine serve` share (engine/process/supervision.py),
where a bare restart starts at the configured budget."""

from __future__ import annotations

import os
import signal
import time

import pytest

from engine.process.client import EngineClient
from engine.process.supervision import Kept, restart_keeping

CONFIGURED = 64
SEQS = 8


@pytest.fixture(scope="module")
def client(tiny_model_dir):
    c = EngineClient(None, model=str(tiny_model_dir("llama")), device="cpu", max_num_seqs=SEQS,
                     max_num_batched_tokens=CONFIGURED, max_model_len=256, block_size=16)
    yield c
    c.shutdown()


def _kill(client: EngineClient) -> None:
    os.kill(client.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while client.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not client.alive()


def test_a_budget_set_through_the_client_survives_a_kept_restart(client):
    first = client.settings()
    assert first["max_num_batched_tokens"] == CONFIGURED
    with pytest.raises(ValueError, match=f"from {SEQS} to {CONFIGURED} while the engine runs"):
        client.configure(max_num_batched_tokens=CONFIGURED * 2)
    after = client.configure(max_num_batched_tokens=16, expect_version=first["settings_version"],
                             origin="a test")
    assert after["max_num_batched_tokens"] == 16
    assert after["settings_version"] == first["settings_version"] + 1

    # A bare restart starts at the configured budget ...
    _kill(client)
    client.restart()
    assert client.settings()["max_num_batched_tokens"] == CONFIGURED

    # ... the restart policy puts back the budget last seen.
    client.configure(max_num_batched_tokens=16)
    kept = Kept()
    kept.remember(client.settings())
    _kill(client)
    settings = restart_keeping(client, kept, origin="a test")
    assert settings["max_num_batched_tokens"] == 16
    assert client.settings()["max_num_batched_tokens"] == 16
    out = client.generate([1, 2, 3], dict(max_tokens=4, temperature=0.0, ignore_eos=True),
                          timeout=30)
    assert len(out.token_ids) == 4
