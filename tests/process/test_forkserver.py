"""Engine processes forked from a fork server (engine/process/forkserver.py) behave as spawned
ones to their owner: same output, exit code and reason, process group of their own; the fork
server is one per owner (and environment), its children are the engines; a dead fork server
costs nothing but a fresh spawn; where forking is not safe (a GPU machine, a CUDA engine) or
switched off, engines are spawned fresh.

The rest of the suite runs its CPU engines through the fork server too (tests/engine,
tests/process, tests/serving, tests/ui, tests/browser), which covers hangs, kills, restarts and an
owner's death; this module checks what is particular to forking.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from engine_procs import engine_pids, parent_of, process_gone  # tests/ is on sys.path (conftest.py)

from engine import SamplingParams
from engine.process import forkserver
from engine.process.client import EngineClient
from engine.process.spawn import EngineProcess

SMALL = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
             block_size=16)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return str(tiny_model_dir("llama"))


def test_a_forked_engine_is_the_fork_servers_child_and_answers_as_a_spawned_one(
        model, monkeypatch) -> None:
    forked = EngineClient(None, model=model, **SMALL)
    try:
        monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
        spawned = EngineClient(None, model=model, **SMALL)
    finally:
        monkeypatch.delenv(forkserver.ENV_SWITCH)
    try:
        assert type(forked._session.proc).__name__ == "ForkedEngine"
        assert isinstance(spawned._session.proc, EngineProcess)
        server = parent_of(forked.pid)
        assert server != os.getpid() and parent_of(server) == os.getpid()
        assert parent_of(spawned.pid) == os.getpid()
        assert set(engine_pids(os.getpid())) >= {forked.pid, spawned.pid}
        # Named apart in ps and top, and in their command lines (a fork starts with its
        # parent's).
        assert Path(f"/proc/{forked.pid}/comm").read_text().strip() == "gapless-engine"
        assert Path(f"/proc/{server}/comm").read_text().strip() == "gapless-forksrv"
        assert Path(f"/proc/{forked.pid}/cmdline").read_bytes().startswith(
            b"gapless-engine\0engine.process.server\0--fd\0")
        assert Path(f"/proc/{server}/cmdline").read_bytes().startswith(
            b"gapless-forksrv\0engine.process.forkserver_main\0")
        # A process group of its own, as a spawned engine's; not the fork server's.
        assert os.getpgid(forked.pid) == forked.pid != os.getpgid(server)
        prompts = [[1, 2, 3, 4], [5, 6, 7]]
        assert ([forked.generate(p, GREEDY).token_ids for p in prompts]
                == [spawned.generate(p, GREEDY).token_ids for p in prompts])
        # A second engine (a restart) comes from the same fork server.
        forked.restart()
        assert parent_of(forked.pid) == server
        assert forked.generate(prompts[0], GREEDY).token_ids == \
            spawned.generate(prompts[0], GREEDY).token_ids
    finally:
        forked.shutdown()
        spawned.shutdown()


def test_a_killed_forked_engine_gives_its_exit_code_and_the_next_start_works(model) -> None:
    c = EngineClient(None, model=model, **SMALL)
    try:
        os.kill(c.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while c.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.death_reason() == "engine process exited with code -9 (SIGKILL)"
        c.restart()
        assert c.alive() and len(c.generate([1, 2, 3], GREEDY).token_ids) == 8
    finally:
        c.shutdown()


def test_a_dead_fork_server_leaves_its_engine_serving_until_it_ends_and_is_replaced(
        model) -> None:
    """Killing the fork server re-parents its engine, whose watchdog ends it (nothing outlives
    its parent); the owner is told, and the next start gets a new fork server."""
    c = EngineClient(None, model=model, **SMALL)
    try:
        server = parent_of(c.pid)
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while c.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not c.alive(), "the engine outlived its fork server"
        assert c.death_reason()  # says something, whatever the code it could not learn
        c.restart()
        assert parent_of(c.pid) not in (server, os.getpid())  # a new fork server's child
        assert len(c.generate([1, 2], GREEDY).token_ids) == 8
    finally:
        c.shutdown()


def test_a_stopped_fork_server_costs_a_restart_no_wait(model, caplog) -> None:
    """A fork server that cannot fork (SIGSTOP) is not waited for: the restart spawns a fresh
    engine at once (it waited for a fork that could not come, then spawned), and the next
    start gets a new fork server."""
    c = EngineClient(None, model=model, **SMALL)
    server = parent_of(c.pid)
    try:
        os.kill(server, signal.SIGSTOP)
        t0 = time.monotonic()
        c.restart()
        took = time.monotonic() - t0
        assert parent_of(c.pid) == os.getpid()  # spawned fresh
        assert len(c.generate([1, 2, 3], GREEDY).token_ids) == 8
        print(f"\nrestart beside a stopped fork server: {took:.1f} s")
        # A fresh spawn, not a wait for a fork that cannot come: the stopped fork server is
        # seen before it is asked (the time is printed, not bounded: on a loaded machine a
        # spawn alone can take longer than any bound that would tell the two apart).
        assert "is stopped" in caplog.text, caplog.text
        c.restart()
        assert parent_of(c.pid) not in (server, os.getpid())  # a new fork server's child
    finally:
        os.kill(server, signal.SIGCONT)
        c.shutdown()


def test_the_owners_death_ends_the_fork_server_and_its_engines(model, tmp_path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        from engine.process.client import EngineClient
        c = EngineClient(None, model={model!r}, device="cpu", max_num_seqs=2,
                         max_num_batched_tokens=32, max_model_len=64)
        print(c.pid, flush=True)
        time.sleep(120)
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        engine = int(owner.stdout.readline())
        server = parent_of(engine)
        assert parent_of(server) == owner.pid
        os.kill(engine, signal.SIGSTOP)  # even a stopped engine must go
        owner.kill()
        owner.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(map(process_gone, (engine, server))):
            time.sleep(0.1)
        assert [p for p in (engine, server) if not process_gone(p)] == [], \
            "the fork server or its engine outlived the owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)


def test_forking_only_where_it_is_safe(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(forkserver.ENV_SWITCH, raising=False)
    monkeypatch.setattr(forkserver, "GPU_NODES", (str(tmp_path / "no-such-node"),))
    assert forkserver.forkserver_wanted("cpu") and forkserver.forkserver_wanted("auto")
    assert not forkserver.forkserver_wanted("cuda")
    monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
    assert not forkserver.forkserver_wanted("cpu")
    monkeypatch.delenv(forkserver.ENV_SWITCH)
    monkeypatch.setattr(forkserver, "GPU_NODES", (str(tmp_path),))  # a GPU's node exists
    assert not forkserver.forkserver_wanted("cpu") and not forkserver.forkserver_wanted("auto")
