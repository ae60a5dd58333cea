"""Several clients on one engine process: the owner starts it with ``listen=``, others attach
through a private Unix socket. Each sees its own requests' deltas, every one gets the
telemetry and the heartbeat, detaching leaves the engine serving (and aborts what the
leaver had open), and the owner's shutdown tells the attached clients why.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from engine.process.client import EngineClient, EngineDead

SMALL = dict(
    device="cpu", max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512, block_size=16
)
GREEDY = dict(max_tokens=16, temperature=0.0, ignore_eos=True)
LONG = dict(max_tokens=400, temperature=0.0, ignore_eos=True)
REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float, step: float = 0.02) -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def sock_path(tmp_path_factory):
    return tmp_path_factory.mktemp("attach") / "run" / "engine.sock"


@pytest.fixture(scope="module")
def owner(tiny_model_dir, sock_path):
    c = EngineClient(None, model=str(tiny_model_dir("llama")), listen=sock_path, **SMALL)
    yield c
    c.shutdown()


def test_the_socket_is_private_and_refuses_a_second_engine(owner, sock_path):
    assert stat.S_IMODE(os.stat(sock_path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    assert owner.process_info()["listen"] == str(sock_path)
    with pytest.raises(ValueError, match="an engine is already listening on"):
        EngineClient(None, listen=sock_path, **SMALL)


def test_two_clients_each_see_their_own_requests_and_all_telemetry(owner, sock_path):
    other = EngineClient.attach(sock_path)
    try:
        assert other.attached and not owner.attached and other.pid == owner.pid
        info = other.process_info()
        assert info["clients"] == 2 and info["owner"] is False
        assert owner.process_info()["owner"] is True
        prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8], [1, 6, 1, 8], [9, 9]]
        solo = [owner.generate(p, GREEDY, timeout=30) for p in prompts]
        mine = [owner.submit(p, GREEDY) for p in prompts[:2]]
        theirs = [other.submit(p, GREEDY) for p in prompts[2:]]
        texts: dict[str, str] = {}

        def drain(c: EngineClient, rid: str) -> None:
            texts[rid] = "".join(c.stream(rid, timeout=30))

        threads = [threading.Thread(target=drain, args=(c, r)) for c, rids in
                   ((owner, mine), (other, theirs)) for r in rids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for c, rid, exp in zip([owner, owner, other, other], mine + theirs, solo, strict=True):
            out = c.result(rid, timeout=30)
            assert out.token_ids == exp.token_ids and texts[rid] == out.text == exp.text
        with pytest.raises(ValueError, match="unknown request id"):
            other.result(mine[0])  # the owner's request is not this client's
        assert len(set(mine + theirs)) == 4  # ids picked by two clients never collide

        def seen_by(c: EngineClient, rid: str) -> bool:
            return any(e.request_id == rid and e.kind == "finished"
                       for e in c.telemetry().snapshot_events(500))

        for c in (owner, other):  # every client gets every request's telemetry
            wait_for(lambda c=c: all(seen_by(c, r) for r in mine + theirs), 3.0)
            assert c.telemetry().snapshot_steps(10)
        assert other.settings() == owner.settings()
        wait_for(lambda: other.status().step >= 0, 2.0)  # its first heartbeat
        assert other.status().state == "alive"
    finally:
        other.shutdown()


def test_detaching_leaves_the_engine_serving_and_aborts_the_leavers_requests(owner, sock_path):
    other = EngineClient.attach(sock_path)
    rid = other.submit([5, 5, 5], LONG)
    next(other.stream(rid, timeout=30))
    other.shutdown()
    assert not other.alive()
    assert other.death_reason() == "this client detached from the engine"
    assert owner.alive() and owner.responding()

    def aborted() -> bool:
        return any(e.request_id == rid and e.kind == "finished" and e.reason == "abort"
                   for e in owner.telemetry().snapshot_events(500))

    wait_for(aborted, 5.0)
    wait_for(lambda: owner.stats()["unfinished"] == 0, 5.0)
    assert owner.generate([1, 2, 3], GREEDY, timeout=30).finish_reason == "length"
    assert owner.process_info()["clients"] == 1
    other.restart()  # an attached client's restart attaches again
    try:
        assert other.alive() and other.generate([1, 2], GREEDY, timeout=30).token_ids
    finally:
        other.shutdown()


def test_heartbeat_reaches_attached_clients(owner, sock_path):
    other = EngineClient.attach(sock_path)
    try:
        os.kill(owner.pid, signal.SIGSTOP)
        try:
            took = wait_for(lambda: other.status().state == "not_responding", 4.0)
            assert took < 3.5
        finally:
            os.kill(owner.pid, signal.SIGCONT)
        wait_for(other.responding, 3.0)
    finally:
        other.shutdown()


def test_the_owners_shutdown_tells_attached_clients(tiny_model_dir, tmp_path):
    path = tmp_path / "run" / "engine.sock"
    own = EngineClient(None, model=str(tiny_model_dir("llama")), listen=path, **SMALL)
    other = EngineClient.attach(path)
    rid = other.submit([8, 8, 8], LONG)
    next(other.stream(rid, timeout=30))
    own.shutdown()
    wait_for(lambda: not other.alive(), 3.0)
    assert other.death_reason() == "the engine was shut down by its owner"
    assert other.result(rid, timeout=1).finish_reason in ("abort", "error")
    with pytest.raises(EngineDead, match="shut down by its owner"):
        other.stats()
    assert not path.exists()  # the socket is removed with the engine
    other.shutdown()  # detaching from a gone engine is quiet


def test_attached_clients_are_told_when_the_owner_process_dies(tiny_model_dir, tmp_path):
    path = tmp_path / "run" / "engine.sock"
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from engine.process.client import EngineClient
        c = EngineClient(None, model={str(tiny_model_dir("llama"))!r}, listen={str(path)!r},
                         device="cpu", max_num_seqs=2, max_num_batched_tokens=32,
                         max_model_len=64)
        print(c.pid, flush=True)
        time.sleep(120)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(parent.stdout.readline()))
        reader.start()
        reader.join(90)
        assert line and line[0].strip(), "the owner never reported its engine"
        other = EngineClient.attach(path)
        assert other.pid == int(line[0])
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(5)
        wait_for(lambda: not other.alive(), 5.0)
        assert other.death_reason().startswith(f"the engine's owner (pid {parent.pid})")
        assert other.death_reason().endswith("the engine process exited")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(5)
