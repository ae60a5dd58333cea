"""One connected client as the engine process sees it: its outbox and the thread that sends it.

Owns the engine side of one connection: a queue of messages (the step loop's callbacks only
put into it), a sender thread that batches whatever is queued into one frame, the request
ids this client submitted that have not ended yet (so a client that leaves has its requests
aborted: nothing runs that nobody can see), and closing with a last flush. It never runs
engine commands (server.py does) and never blocks the thread that queues a message.
"""

from __future__ import annotations

import logging
import queue
import threading
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

from engine.process.endpoint import hang_up
from engine.process.wire import End, Message, Reply, describe

log = logging.getLogger("gapless.server")

MAX_BATCH = 512
# Telemetry is not queued for a client while this many messages wait for it: a stalled
# client must not make the engine process grow.
MAX_BACKLOG = 2000


def pickle_frame(message: Message | list[Message]) -> bytes:
    return bytes(ForkingPickler.dumps(message))


class ClientLink:
    """The owner (the process that started the engine, over its pipe) or an attached client
    (over the listening socket)."""

    def __init__(self, conn: Connection, name: str, owner: bool) -> None:
        self.conn = conn
        self.name = name
        self.owner = owner
        # Messages, or bytes: a frame pickled once and sent to every client as is.
        self.outbox: queue.SimpleQueue[Message | bytes | None] = queue.SimpleQueue()
        self.open: set[str] = set()  # submitted here and not ended; the sender updates it
        self.gone = threading.Event()  # the connection failed or was closed
        self._sender = threading.Thread(target=self._send_loop, name=f"gapless-send-{name}",
                                        daemon=True)

    def start(self) -> ClientLink:
        self._sender.start()
        return self

    def put(self, msg: Message | bytes) -> None:
        self.outbox.put(msg)

    def backlog(self) -> int:
        return self.outbox.qsize()

    def close(self, flush_timeout: float = 5.0) -> None:
        """Send what is queued (up to ``flush_timeout``), then close the connection."""
        self.outbox.put(None)
        if self._sender.is_alive() and self._sender is not threading.current_thread():
            self._sender.join(flush_timeout)
        self.gone.set()
        hang_up(self.conn)
        try:
            self.conn.close()
        except OSError:
            pass

    def _send_loop(self) -> None:
        while True:
            first = self.outbox.get()
            if first is None:
                return
            batch: list[Message | bytes] = [first]
            while len(batch) < MAX_BATCH:
                try:
                    msg = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if msg is None:
                    self.outbox.put(None)  # see it again after this batch
                    break
                batch.append(msg)
            try:
                self._send(batch)
            except OSError:  # the client is gone: its reader sees EOF and drops it
                self.gone.set()
                return

    def _send(self, batch: list[Message | bytes]) -> None:
        messages: list[Message] = []
        for item in batch:
            if isinstance(item, bytes):  # keep the order: what came before goes first
                if messages:
                    self.conn.send_bytes(self._pickle_batch(messages))
                    messages = []
                self.conn.send_bytes(item)
            else:
                if isinstance(item, End):
                    self.open.discard(item.request_id)
                messages.append(item)
        if messages:
            self.conn.send_bytes(self._pickle_batch(messages))

    @staticmethod
    def _pickle_batch(batch: list[Message]) -> bytes:
        try:
            return pickle_frame(batch)
        except Exception:  # one bad value must not silence the pipe: find it, answer instead
            good: list[Message] = []
            for msg in batch:
                try:
                    pickle_frame(msg)
                except Exception as e:
                    log.exception("cannot send a %s message", type(msg).__name__)
                    if isinstance(msg, Reply):
                        msg = Reply(msg.call_id, False, (
                            "EngineError", f"the engine's answer could not be sent: {describe(e)}"))
                    else:
                        continue
                good.append(msg)
            return pickle_frame(good)
