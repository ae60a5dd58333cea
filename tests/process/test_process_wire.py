"""The engine process's protocol without a model: the server answers over a real socket pair
to a real client Session (a stand-in engine behind it), the heartbeat tells a stuck step
loop apart from a hung process, and the local socket is private and refuses to clobber a
live engine.
"""

from __future__ import annotations

import os
import pickle
import socket
import stat
import time
from multiprocessing.connection import Connection
from types import SimpleNamespace

import pytest

from engine.process import endpoint
from engine.process.client import EngineClient
from engine.process.pump import LoopWatch
from engine.process.server import EngineServer
from engine.process.session import Session
from engine.process.status import EngineDead, EngineNotResponding
from engine.process.wire import NO_REPLY, Call, Command
from telemetry.bus import TelemetryBus


class StandInEngine:
    """What EngineServer reads of an Engine: settings, stats, the bus and the step counter."""

    def __init__(self, unfinished: int = 0) -> None:
        self.bus = TelemetryBus()
        self.loop = SimpleNamespace(step_no=0)
        self.unfinished = unfinished
        self.aborted: list[str] = []

    def settings(self) -> dict:
        return {"model": "stand-in"}

    def stats(self) -> dict:
        return {"unfinished": self.unfinished, "running": self.unfinished}

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def shutdown(self) -> None:
        pass


class NoNvml:
    available, reason = False, "no GPU: stand-in"

    def latest(self) -> None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def served():
    """(server, client-side Session, engine) over a socket pair, the server on a thread."""
    import threading

    engine = StandInEngine()
    ours, theirs = socket.socketpair()
    server = EngineServer(engine, NoNvml())
    owner = server.add_link(Connection(theirs.detach()), owner=True)
    threading.Thread(target=server.serve, args=(owner,), daemon=True).start()
    session = Session(Connection(ours.detach()), TelemetryBus(), proc=None,
                      not_responding_after_s=1.0, stall_after_s=0.3)
    session.wait_ready(5.0)
    yield server, session, engine
    server.stopping.set()
    session.leaving = "test over"
    session.close()


def test_calls_answer_and_bad_commands_say_what_is_known(served):
    server, session, engine = served
    assert session.call(Command.SETTINGS, 5.0) == {"model": "stand-in",
                                                  "benchmark_running": False,
                                                  "engine_pid": session.pid}
    assert session.info["owner"] is True and session.info["listen"] is None
    with pytest.raises(ValueError, match="unknown engine command 'fly'; known: start, submit"):
        session.finish_call(session.begin("fly"), Command.SETTINGS, 5.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start is not a command a running engine takes"):
        session.call(Command.START, 5.0)
    with pytest.raises(ValueError, match="request_id must be a string, got"):
        server.commands.table[Command.ABORT](None, request_id=["x"])
    session.notify(Command.ABORT, request_id="r1")  # a notification: no Reply comes back
    assert session.call(Command.STATS, 5.0)["unfinished"] == 0  # answered in order, after it
    assert engine.aborted == ["r1"]


def test_heartbeat_tells_a_stuck_loop_from_a_hung_process(served):
    server, session, engine = served
    time.sleep(0.7)
    assert session.status().state == "alive" and session.beat.step == 0
    engine.unfinished = 2  # work waits and the step counter does not move
    deadline = time.monotonic() + 5
    while session.status().state != "stalled":
        assert time.monotonic() < deadline, "the stuck loop was never reported"
        time.sleep(0.05)
    status = session.status()
    assert "made no progress" in status.reason and "2 requests unfinished" in status.reason
    assert session.call(Command.STATS, 5.0)["unfinished"] == 2  # the process still answers
    engine.loop.step_no = 7  # progress again
    deadline = time.monotonic() + 3
    while session.status().state != "alive":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert session.status().step == 7
    # Silence (the pump stops: as if the process were stopped) is "not responding".
    server.stopping.set()
    deadline = time.monotonic() + 3
    while session.status().state != "not_responding":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "not even its heartbeat" in session.status().reason
    t0 = time.monotonic()
    with pytest.raises(EngineNotResponding):
        session.call(Command.STATS, 30.0)
    assert time.monotonic() - t0 < 0.2, "a call to a silent engine must fail at once"


def test_loop_watch_counts_only_time_without_progress_while_work_waits():
    w = LoopWatch()
    assert w.observe(5, 3, 0) == 0.0
    assert w.observe(5, 3, 2_000_000_000) == 2.0
    assert w.observe(6, 3, 3_000_000_000) == 0.0  # a step ran
    assert w.observe(6, 0, 9_000_000_000) == 0.0  # idle is not stuck
    assert w.observe(6, 1, 10_000_000_000) == 1.0


def test_a_notification_failure_is_not_answered(served):
    server, session, engine = served
    link = server.links[0]
    before = link.backlog()
    server.answer(link, NO_REPLY, False, ("ValueError", "bad"))
    assert link.backlog() == before
    assert pickle.loads(pickle.dumps(Call(1, Command.STATS, b""))).command is Command.STATS


def test_the_socket_is_private_and_a_live_one_is_not_clobbered(tmp_path):
    path = tmp_path / "run" / "engine.sock"
    sock, bound = endpoint.bind(path)
    try:
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with pytest.raises(ValueError, match="an engine is already listening on"):
            endpoint.check_listen_path(path)
        with pytest.raises(ValueError, match="an engine is already listening on"):
            EngineClient(None, listen=path)  # refused before any process starts
        peer = endpoint.connect(path, 1.0)
        conn, _ = sock.accept()
        assert endpoint.peer_uid(conn) == os.getuid()
        conn.close()
        peer.close()
    finally:
        sock.close()
    # Nobody listens now: a stale socket file is replaced.
    sock, _ = endpoint.bind(path)
    sock.close()


def test_unsafe_socket_paths_are_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(ValueError, match=r"can be used by other users \(mode 0755\)"):
        endpoint.check_listen_path(shared / "engine.sock")
    (tmp_path / "file").write_text("x")
    tmp_path.chmod(0o700)
    with pytest.raises(ValueError, match="exists and is not a socket"):
        endpoint.check_listen_path(tmp_path / "file")
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        endpoint.check_listen_path(tmp_path / ("x" * 120))
    with pytest.raises(ValueError, match="no engine socket at"):
        EngineClient.attach(tmp_path / "nothing.sock")
    with pytest.raises(ValueError, match="give_up_after_s must be a number of seconds > 0"):
        EngineClient.attach(tmp_path / "nothing.sock", give_up_after_s=0)


def test_an_engine_that_leaves_without_a_word_is_dead_with_a_reason(served):
    server, session, engine = served
    for link in list(server.links):
        link.close(1.0)
    deadline = time.monotonic() + 3
    while session.dead is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert "closed without a word" in session.dead
    with pytest.raises(EngineDead, match="closed without a word"):
        session.call(Command.STATS, 5.0)


def test_every_message_kind_round_trips_as_a_tagged_tuple():
    from engine.process import wire

    kinds = [wire.Reply(3, True, {"a": 1}), wire.Delta("r", "hi", [1, 2]),
             wire.End("r", {"text": "hi"}), wire.Telemetry([], []), wire.Nvml({"gpu_util": 50}),
             wire.BenchItem(4, "item"), wire.Ready({"pid": 1}), wire.Failed("bad model"),
             wire.Heartbeat(7, 2, 0.0), wire.Closing("bye")]
    assert len({type(m).TAG for m in kinds}) == len(kinds)
    for msg in kinds:
        raw = pickle.loads(pickle.dumps(wire.encode(msg)))
        assert type(raw) is tuple
        assert wire.decode(raw) == msg and type(wire.decode(raw)) is type(msg)
    assert wire.delta_raw("r", "hi", [1]) == wire.encode(wire.Delta("r", "hi", [1]))
    assert wire.end_raw("r", {}) == wire.encode(wire.End("r", {}))
    with pytest.raises(ValueError, match="unknown message tag"):
        wire.decode((99, "x"))


def test_an_answer_that_cannot_be_pickled_becomes_an_error_reply():
    from engine.process import wire
    from engine.process.links import ClientLink

    batch = [wire.encode(wire.Reply(5, True, lambda: 0)), wire.delta_raw("r", "ok", [1])]
    sent = [wire.decode(raw) for raw in pickle.loads(ClientLink._pickle_batch(batch))]
    assert sent[0].call_id == 5 and sent[0].ok is False
    assert "the engine's answer could not be sent" in sent[0].value[1]
    assert sent[1] == wire.Delta("r", "ok", [1])


def test_no_process_module_matches_protocol_names_as_bare_strings():
    """The commands and message kinds are wire.py's named types: no other module of
    engine/process compares, matches or tags with one of their names as a string."""
    import ast
    from pathlib import Path

    from engine.process import wire

    names = {c.value for c in wire.Command} | {
        cls.__name__.lower() for cls in (wire.Reply, wire.Delta, wire.End, wire.Telemetry,
                                         wire.Nvml, wire.BenchItem, wire.Ready, wire.Failed,
                                         wire.Heartbeat, wire.Closing)} | {"bench"}
    names -= {"abort"}  # also a finish_reason of RequestOutput, which is not the wire's

    def strings(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    folder = Path(wire.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.name == "wire.py":
            continue
        used: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Compare, ast.MatchValue)):
                used |= strings(node)
            elif isinstance(node, ast.Tuple) and node.elts:  # a message's tag
                used |= strings(node.elts[0])
            elif isinstance(node, ast.Return) and node.value is not None:
                used |= {n.value for n in [node.value]
                         if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        bare = used & names
        assert not bare, f"{path.name} matches protocol names as strings: {sorted(bare)}"


def test_the_default_socket_path_is_per_user(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert endpoint.default_socket_path() == tmp_path / "gapless" / "engine.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert endpoint.default_socket_path().parent.name == f"gapless-{os.getuid()}"


def test_a_death_ends_the_open_requests_on_the_mirror_before_it_shows(served):
    """A request's own events leave the engine with its pump (every 50 ms), its tokens at
    once: a request can stream tokens and die with the engine before its "queued" event left.
    The session's mirror then holds a "finished" (engine_dead) event for each request still
    open, published before the session reads as dead, so /metrics counts every one."""
    from prometheus_client import CollectorRegistry

    from engine.serving.request_metrics import RequestMetrics

    _, session, _ = served
    seen_dead_at_publish = []
    publish = session.bus.publish_event

    def watched(ev):
        seen_dead_at_publish.append(session.dead)
        publish(ev)

    session.bus.publish_event = watched
    reader = session.bus.reader(from_now=True)
    running, done = session.streams.open("running"), session.streams.open("done")
    done.end_here("stop", "")
    session.mark_dead("engine process exited with code -9 (SIGKILL)")
    events = reader.events()
    assert [(e.request_id, e.kind, e.reason) for e in events] == [
        ("running", "finished", "engine_dead")]
    assert seen_dead_at_publish == [None]
    assert running.output.finish_reason == "error"
    session.mark_dead("a second caller")  # first caller wins: nothing published again
    assert reader.events() == []

    metrics = RequestMetrics(CollectorRegistry(), "m", 64)
    metrics.on_event(events[0])  # its "queued" never arrived: counted all the same
    assert metrics.failed["engine_dead"]._value.get() == 1
    assert metrics.engine_gone() == 0
