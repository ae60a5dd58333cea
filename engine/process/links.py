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

from engine.process.endpoint import hang_up
from engine.process.wire import End, Message, Raw, Reply, describe, encode, pickle_frame

log = logging.getLogger("gapless.server")

MAX_BATCH = 512
# Telemetry is not queued for a client while this many messages wait for it: a stalled
# client must not make the engine process grow.
MAX_BACKLOG = 2000


class ClientLink:
    """The owner (the process that started the engine, over its pipe) or an attached client
    (over the listening socket)."""

    def __init__(self, conn: Connection, name: str, owner: bool) -> None:
        self.conn = conn
        self.name = name
        self.owner = owner
        # Encoded messages (wire.encode), or bytes: a frame pickled once and sent to every
        # client as is. The step loop's callbacks put into it directly.
        self.outbox: queue.SimpleQueue[Raw | bytes | None] = queue.SimpleQueue()
        self.open: set[str] = set()  # submitted here and not ended; the sender updates it
        self.gone = threading.Event()  # the connection failed or was closed
        self._sender = threading.Thread(target=self._send_loop, name=f"gapless-send-{name}",
                                        daemon=True)

    def start(self) -> ClientLink:
        self._sender.start()
        return self

    def put(self, msg: Message) -> None:
        self.outbox.put(encode(msg))

    def put_frame(self, frame: bytes) -> None:
        self.outbox.put(frame)

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
            batch: list[Raw | bytes] = [first]
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

    def _send(self, batch: list[Raw | bytes]) -> None:
        messages: list[Raw] = []
        for item in batch:
            if isinstance(item, bytes):  # keep the order: what came before goes first
                if messages:
                    self.conn.send_bytes(self._pickle_batch(messages))
                    messages = []
                self.conn.send_bytes(item)
            else:
                if item[0] == End.TAG:
                    self.open.discard(item[1])
                messages.append(item)
        if messages:
            self.conn.send_bytes(self._pickle_batch(messages))

    @staticmethod
    def _pickle_batch(batch: list[Raw]) -> bytes:
        try:
            return pickle_frame(batch)
        except Exception:  # one bad value must not silence the pipe: find it, answer instead
            good: list[Raw] = []
            for msg in batch:
                try:
                    pickle_frame(msg)
                except Exception as e:
                    log.exception("cannot send a message tagged %r", msg[0])
                    if msg[0] == Reply.TAG:
                        why = f"the engine's answer could not be sent: {describe(e)}"
                        msg = encode(Reply(msg[1], False, ("EngineError", why)))
                    else:
                        continue
                good.append(msg)
            return pickle_frame(good)
