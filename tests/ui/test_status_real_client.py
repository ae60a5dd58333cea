"""ui.engine_link reads the real EngineClient.status() object (state, reason, silent_s), not only
the stand-in's plain strings: a hung engine must read "not responding" on every page."""

from __future__ import annotations

from engine.process.status import EngineStatus as ClientStatus
from ui.engine_link import engine_status


class Client:
    def __init__(self, status: ClientStatus) -> None:
        self._status = status

    def status(self) -> ClientStatus:
        return self._status

    def death_reason(self) -> str:
        return "engine process exited with code -9 (SIGKILL)"


def status(state: str, reason: str | None = None, silent_s: float = 0.0) -> ClientStatus:
    return ClientStatus(state=state, reason=reason, silent_s=silent_s, step=7,
                        loop_stalled_s=0.0)


def test_each_state_of_the_client_reads_as_the_banner_needs() -> None:
    assert engine_status(Client(status("alive"))).state == "alive"
    hung = engine_status(Client(status("not_responding", silent_s=2.4)))
    assert hung.state == "not_responding" and "2.4 s" in hung.reason
    stalled = engine_status(Client(status("stalled", "the step loop has not moved for 12 s")))
    assert stalled.state == "not_responding" and "12 s" in stalled.reason
    dead = engine_status(Client(status("dead", "engine process exited with code 1")))
    assert dead.state == "dead" and "code 1" in dead.reason
