"""The wire format between the engine process and its clients: one owner, both sides import it.

Owns the names of everything that crosses the process boundary: the commands a client sends
(``Command``), the envelope they travel in (``Call``), the messages the engine sends back
(one small NamedTuple per kind), and the compact encoding of telemetry records. server.py
and session.py match on these types, never on bare strings.

It must stay free of engine state, threads and sockets (it is a vocabulary, nothing runs
here), and it never imports torch, streamlit or ui/.

Framing: ``multiprocessing.connection.Connection`` frames, each one a pickle.

- client -> engine: one ``Call`` per frame. Its arguments are pickled apart from the
  envelope, so the engine can always read the call id and answer, even when it cannot
  rebuild an argument (a class it cannot import). ``call_id`` 0 means "no reply wanted"
  (a notification: ABORT, CANCEL_BENCHMARK, and the owner's first frame, START).
- engine -> client: a frame is a list of messages (everything queued since the last send:
  one syscall per batch, not per token) or a single message pickled once and sent to every
  client as is (Telemetry, Nvml, Heartbeat). A message travels as a plain tuple
  ``(TAG, *fields)`` (``encode`` / ``decode``; see below why). Every call with a call id
  gets exactly one ``Reply``; when ``ok`` is False, ``value`` is ``(exception type name,
  message)``.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple

from telemetry.records import RequestEvent, Span, StepRecord


class Command(enum.StrEnum):
    """What a client can ask of the engine process."""

    START = "start"              # the owner's first frame: {"config": EngineConfig dict}
    SUBMIT = "submit"
    ABORT = "abort"              # a notification: never answered, applied in order
    CONFIGURE = "configure"
    SETTINGS = "settings"
    STATS = "stats"
    START_LOAD = "start_load"
    STOP_LOAD = "stop_load"
    LOAD_STATS = "load_stats"
    PROCESS_INFO = "process_info"
    RECORD_ANATOMY = "record_anatomy"    # answered from its own thread when recorded
    RUN_BENCHMARK = "run_benchmark"      # answered by BenchItems, then one Reply
    CANCEL_BENCHMARK = "cancel_benchmark"
    SHUTDOWN = "shutdown"        # the owner ends the engine; an attached client detaches
    DETACH = "detach"            # an attached client leaves; its open requests are aborted


NO_REPLY = 0  # the call id of a notification


class Call(NamedTuple):
    call_id: int
    command: Command
    payload: bytes  # pickled kwargs


# ------------------------------------------------------------------ engine -> client
class Reply(NamedTuple):
    call_id: int
    ok: bool
    value: Any  # the result, or (exception type name, message) when not ok
    TAG = 1


class Delta(NamedTuple):
    """New text of one request, with the token ids sampled since its last Delta (the text
    of the last ones may still be held back by the detokenizer)."""

    request_id: str
    text: str
    token_ids: list[int]
    TAG = 2


class End(NamedTuple):
    request_id: str
    output: dict[str, Any]  # RequestOutput as a dict
    TAG = 3


class Telemetry(NamedTuple):
    steps: list[tuple[Any, ...]]   # encode_steps
    events: list[tuple[Any, ...]]  # encode_events
    TAG = 4


class Nvml(NamedTuple):
    """A new NVML reading. Why there is none (no GPU, no driver) is said once, in Ready."""

    reading: dict[str, Any]  # NvmlReading as a dict
    TAG = 5


class BenchItem(NamedTuple):
    call_id: int
    item: Any  # BenchmarkProgress | BenchmarkResult
    TAG = 6


class Ready(NamedTuple):
    """Sent once to every client when it is connected and the engine serves."""

    info: dict[str, Any]  # pid, settings, nvml_available, nvml_reason, owner, listen
    TAG = 7


class Failed(NamedTuple):
    """Sent instead of Ready when the engine cannot start (a message a user can act on)."""

    message: str
    TAG = 8


class Heartbeat(NamedTuple):
    """Sent every HEARTBEAT_PERIOD_S by the engine process's pump thread (not the step loop),
    so a silent pipe means a hung process, while ``loop_stalled_s`` separately says how long
    the step loop has made no progress although requests were unfinished (0.0 when fine)."""

    step: int
    unfinished: int
    loop_stalled_s: float
    TAG = 9


class Closing(NamedTuple):
    """The engine is about to close this connection; ``reason`` is what the client reports."""

    reason: str
    TAG = 10


Message = Reply | Delta | End | Telemetry | Nvml | BenchItem | Ready | Failed | Heartbeat | Closing
Raw = tuple[Any, ...]  # a message as it travels: (TAG, *fields)

HEARTBEAT_PERIOD_S = 0.5

_BY_TAG: dict[int, type] = {cls.TAG: cls for cls in (
    Reply, Delta, End, Telemetry, Nvml, BenchItem, Ready, Failed, Heartbeat, Closing)}


# Messages travel as plain tuples tagged with their kind's TAG: pickling a NamedTuple runs
# its reduce in Python, ~10x the cost of a plain tuple, and the engine process pays it on the
# GIL its step loop needs. The client rebuilds the named form (decode), in its own process.
def encode(msg: Message) -> Raw:
    return (msg.TAG, *msg)


def decode(raw: Raw) -> Message:
    """The named message; ValueError for a tag this side does not know."""
    cls = _BY_TAG.get(raw[0]) if raw else None
    if cls is None:
        raise ValueError(f"unknown message tag {raw[:1]!r}")
    return cls(*raw[1:])


def pickle_frame(obj: Any) -> bytes:
    """One frame's bytes, as ``Connection.send_bytes`` takes them (``recv`` unpickles them):
    a Call, a list of Raw messages, or one Raw message pickled once for every client."""
    return bytes(ForkingPickler.dumps(obj))


def delta_raw(request_id: str, text: str, token_ids: list[int]) -> Raw:
    """encode(Delta(...)) without building the NamedTuple: it runs on the step loop."""
    return (Delta.TAG, request_id, text, token_ids)


def end_raw(request_id: str, output: dict[str, Any]) -> Raw:
    """encode(End(...)) without building the NamedTuple: it runs on the step loop."""
    return (End.TAG, request_id, output)


# ------------------------------------------------------------------------- telemetry
# Telemetry travels as plain tuples: pickling a frozen slots dataclass costs ~30x more, and
# that cost is paid in the engine process, on the GIL the step loop needs. The client
# rebuilds the records (decode_steps / decode_events), in its own process.
STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepRecord) if f.name != "spans")
EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(RequestEvent))
_step_values = operator.attrgetter(*STEP_FIELDS)
_event_values = operator.attrgetter(*EVENT_FIELDS)


def encode_steps(records: list[StepRecord]) -> list[tuple[Any, ...]]:
    return [(_step_values(r), [(s.lane, s.start_ns, s.end_ns) for s in r.spans])
            for r in records]


def decode_steps(rows: list[tuple[Any, ...]]) -> list[StepRecord]:
    return [StepRecord(**dict(zip(STEP_FIELDS, values, strict=True)),
                       spans=[Span(*s) for s in spans]) for values, spans in rows]


def encode_events(events: list[RequestEvent]) -> list[tuple[Any, ...]]:
    return [_event_values(e) for e in events]


def decode_events(rows: list[tuple[Any, ...]]) -> list[RequestEvent]:
    return [RequestEvent(*row) for row in rows]


def describe(exc: BaseException) -> str:
    """A user-facing message: ValueErrors already say what is wrong and what is allowed."""
    if isinstance(exc, ValueError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
