"""A stand-in engine client and tokenizer for HTTP tests that need no model: the client answers
every prompt with "hello" in two deltas, delivered as the real client's receiver thread
delivers them (engine/process/streams.py)."""

from __future__ import annotations

import threading
import time

from engine.core.request import RequestOutput
from telemetry.bus import TelemetryBus


class FakeTokenizer:
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % 256 for c in text]}

    def __len__(self) -> int:
        return 256


class FakeClient:
    """Answers every prompt with "hello" in two deltas; ``fail`` makes submit raise."""

    def __init__(self) -> None:
        self.bus = TelemetryBus()
        self.fail: BaseException | None = None
        self.submitted: dict[str, list[int]] = {}

    def settings(self) -> dict:
        return {"model": "fake", "max_model_len": 64, "async_batching": True, "num_slots": 2,
                "cuda_graphs": False, "cuda_graphs_available": False}

    def stats(self) -> dict:
        return {"running": 0, "waiting": 0, "kv_blocks_used": 0, "kv_blocks_total": 4,
                "generated_tokens": 2 * len(self.submitted), "preemptions": 0,
                "discarded_tokens": 0}

    def telemetry(self) -> TelemetryBus:
        return self.bus

    def alive(self) -> bool:
        return True

    def death_reason(self) -> None:
        return None

    def submit(self, prompt: list[int], params: object, request_id: str) -> str:
        if self.fail is not None:
            raise self.fail
        self.submitted[request_id] = prompt
        return request_id

    def follow(self, rid: str, wake):
        """Two deltas, 50 ms apart, then the end, as the client's receiver thread would
        deliver them (a Follower of engine/process/streams.py)."""
        from engine.process.streams import Follower, RequestStream

        stream = RequestStream(rid)
        follower = Follower(stream, wake, lambda t0: None)

        def deliver() -> None:
            stream.add("he", [1])
            time.sleep(0.05)
            stream.add("llo", [2])
            stream.finish(RequestOutput(rid, self.submitted[rid], [1, 2], "hello", "stop"))
        threading.Thread(target=deliver, daemon=True).start()
        return follower

    def abort(self, rid: str) -> None:
        pass
