"""One request's state while the engine serves it, and what the caller gets back.

Owns the bookkeeping of a sequence: how many tokens are known, how many are in flight on the
device (sampled by a launched step whose results have not been read yet), how many have KV
in the cache. Never touches a device.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.config import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    arrival_ns: int
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # Tokens whose K/V are in the cache or will be once the launched steps finish.
    num_computed: int = 0
    # Tokens sampled by launched steps whose results the CPU has not read yet (async mode).
    num_pending: int = 0
    block_ids: list[int] = field(default_factory=list)
    row: int = -1  # row of the device token table while running
    finish_reason: str | None = None
    num_preemptions: int = 0
    first_token_ns: int | None = None
    finished_ns: int | None = None
    text: str = ""
    error: str | None = None
    # Prefix cache: prompt tokens found cached at first admission; the key chain of the
    # sequence's full blocks and the cached block standing for its last (block_allocator).
    num_cached_tokens: int = 0
    block_keys: list[int] = field(default_factory=list)
    cache_tail: tuple[int, int] | None = None
    first_scheduled_ns: int | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def seq_len(self) -> int:
        """Length of the sequence counting tokens still in flight."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending

    @property
    def num_sampled(self) -> int:
        return len(self.output_token_ids) + self.num_pending

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def known_token_ids(self) -> list[int]:
        """Every token id the host knows: the prompt, then the outputs already read."""
        if not self.output_token_ids:
            return self.prompt_token_ids
        return self.prompt_token_ids + self.output_token_ids

    def token_id_at(self, pos: int) -> int:
        """Token at a known position (prompt or already-read output)."""
        if pos < len(self.prompt_token_ids):
            return self.prompt_token_ids[pos]
        return self.output_token_ids[pos - len(self.prompt_token_ids)]


@dataclass(slots=True)
class RequestOutput:
    """The finished (or current) result of one request."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
