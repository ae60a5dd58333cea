"""Load generator: keeps an engine busy with synthetic requests, by concurrency or by rate.

Owns LoadSpec (what load to make, validated at construction) and LoadGenerator, a daemon
thread that either keeps ``concurrency`` requests in flight or submits requests at Poisson
arrivals of ``rate`` per second. Prompts are random token ids (no tokenizer work), every
request ignores EOS and runs for exactly ``max_tokens`` tokens, so the load is the same
whatever the model says.

It must never grow without bound: in rate mode, an arrival that finds ``max_inflight``
requests already in flight is dropped (and counted) instead of queued. It stops by itself
when the engine shuts down, and never imports UI code.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import SamplingParams

if TYPE_CHECKING:  # the dashboard imports this module's specs; keep torch out of it
    from engine.engine import Engine, RequestHandle

# Rate mode: how often the generator reaps finished requests while it waits for the next
# arrival (concurrency mode is woken by each request's on_finish instead).
POLL_S = 0.005
# Upper bound of in-flight requests in rate mode, as a multiple of the engine's batch size.
INFLIGHT_PER_SEQ = 4
MAX_CONCURRENCY = 4096
_generator_ids = itertools.count(1)  # request ids of different generators never collide


@dataclass(slots=True)
class LoadSpec:
    """Give exactly one of ``concurrency`` (requests kept in flight) or ``rate`` (requests
    per second, Poisson arrivals). Pass ``concurrency=None`` to drive by rate."""

    concurrency: int | None = 8
    rate: float | None = None
    prompt_len: int = 64
    max_tokens: int = 64
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError(
                "give exactly one of concurrency or rate, got "
                f"concurrency={self.concurrency!r} and rate={self.rate!r} "
                "(pass concurrency=None to drive the load by rate)"
            )
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or not 1 <= self.concurrency <= MAX_CONCURRENCY
        ):
            raise ValueError(
                f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}, "
                f"got {self.concurrency!r}"
            )
        if self.rate is not None and (
            isinstance(self.rate, bool)
            or not isinstance(self.rate, (int, float))
            or not math.isfinite(self.rate)
            or self.rate <= 0
        ):
            raise ValueError(f"rate must be a number of requests per second > 0, got {self.rate!r}")
        for name in ("prompt_len", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {t!r}")

    @property
    def label(self) -> str:
        drive = f"{self.concurrency} in flight" if self.concurrency else f"{self.rate:g}/s"
        return f"{drive}, {self.prompt_len} prompt + {self.max_tokens} new tokens"


def prompt_vocab(engine: Engine) -> int:
    """Token ids below this are safe for prompts: in the model and in the tokenizer."""
    vocab = engine.vocab_size
    try:
        vocab = min(vocab, len(engine.tokenizer))
    except TypeError:  # a tokenizer without __len__: the model's vocabulary it is
        pass
    return max(vocab, 1)


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


class LoadGenerator:
    """Submits synthetic requests to ``engine`` on a daemon thread until stop()."""

    def __init__(self, engine: Engine, spec: LoadSpec, seed: int = 0,
                 max_inflight: int | None = None) -> None:
        if not isinstance(spec, LoadSpec):
            raise ValueError(f"spec must be a LoadSpec, got {type(spec).__name__}")
        limit = engine.max_model_len
        if spec.prompt_len + spec.max_tokens > limit:
            raise ValueError(
                f"prompt_len + max_tokens = {spec.prompt_len + spec.max_tokens} exceeds the "
                f"engine's max_model_len of {limit}; make the prompt or the output shorter"
            )
        self.engine = engine
        self.spec = spec
        self.max_inflight = max_inflight or max(
            INFLIGHT_PER_SEQ * engine.config.max_num_seqs, spec.concurrency or 0)
        self.params = SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature,
                                     ignore_eos=True)
        self._rng = random.Random(seed)
        self._vocab = prompt_vocab(engine)
        self._prefix = f"load{next(_generator_ids)}"
        self._next_id = 0
        self._inflight: list[RequestHandle] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a request ended: the concurrency loop refills
        self._thread: threading.Thread | None = None
        self.submitted = 0
        self.finished = 0  # requests that ended on their own (stop, length, error)
        self.aborted = 0  # requests aborted before their end (stop(abort=True), a client)
        self.dropped = 0  # rate-mode arrivals skipped because max_inflight were in flight
        self.errors = 0  # requests that ended with finish_reason "error"
        self.stopped_reason: str | None = None

    # -------------------------------------------------------------------------- control
    def start(self) -> LoadGenerator:
        if self._thread is not None:
            raise RuntimeError("a LoadGenerator runs once; make a new one to start again")
        self._thread = threading.Thread(target=self._run, name="gapless-loadgen", daemon=True)
        self._thread.start()
        return self

    def stop(self, abort: bool = True, timeout: float = 5.0) -> None:
        """Stop submitting; with ``abort`` also abort the requests still in flight."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if abort:
            with self._lock:
                handles = list(self._inflight)
            for h in handles:
                if not h.done:
                    self.engine.abort(h.request_id)
            deadline = time.monotonic() + timeout
            for h in handles:  # aborts apply at the next step boundary: wait for them
                try:
                    h.result(timeout=max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    break
        self._reap()

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive() and not self._stop.is_set()

    @property
    def inflight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def stats(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "submitted": self.submitted,
            "finished": self.finished,
            "aborted": self.aborted,
            "inflight": self.inflight,
            "dropped": self.dropped,
            "errors": self.errors,
            "stopped_reason": self.stopped_reason,
        }

    # ----------------------------------------------------------------------- the thread
    def _run(self) -> None:
        try:
            if self.spec.concurrency is not None:
                self._run_concurrency(self.spec.concurrency)
            else:
                assert self.spec.rate is not None
                self._run_rate(float(self.spec.rate))
            self.stopped_reason = self.stopped_reason or "stopped"
        except RuntimeError as e:  # the engine shut down under us
            self.stopped_reason = str(e)
        finally:
            self._stop.set()

    def _reap(self) -> None:
        with self._lock:
            keep = []
            for h in self._inflight:
                if h.done:
                    reason = h.result().finish_reason
                    if reason == "abort":
                        self.aborted += 1
                    else:
                        self.finished += 1
                    if reason == "error":
                        self.errors += 1
                else:
                    keep.append(h)
            self._inflight = keep

    def _submit_one(self) -> None:
        rid = f"{self._prefix}-{self._next_id}"
        self._next_id += 1
        prompt = random_prompt(self._rng, self.spec.prompt_len, self._vocab)
        wake = self._wake
        handle = self.engine.submit(prompt, self.params, request_id=rid,
                                    on_finish=lambda _out: wake.set())
        with self._lock:
            self._inflight.append(handle)
        self.submitted += 1

    def _run_concurrency(self, concurrency: int) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before reaping: a finish after this wakes the wait below
            self._reap()
            while self.inflight < concurrency and not self._stop.is_set():
                self._submit_one()
            self._wake.wait(0.1)  # set by a request's end (on_finish) or by stop()

    def _run_rate(self, rate: float) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            next_at += self._rng.expovariate(rate)
            while not self._stop.is_set():
                self._reap()
                left = next_at - time.perf_counter()
                if left <= 0:
                    break
                self._stop.wait(min(left, POLL_S * 4))
            if self._stop.is_set():
                return
            if self.inflight >= self.max_inflight:
                self.dropped += 1
            else:
                self._submit_one()
