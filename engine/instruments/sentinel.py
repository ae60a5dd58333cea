"""The async-correctness sentinel: a live check that served greedy tokens are the model's.

Owns sampling finished greedy requests (1 in `sample_every`; 0 = off), re-scoring each sampled
one teacher-forced (one causal forward over prompt + output on the same model, in chunks of
the engine's token budget, with a private paged KV cache) and counting the produced tokens
that were not the argmax given the tokens before them. That check needs no scheduler, no
slots, no carry-over and no async pipeline: it is the plain synchronous forward, so a token
that an async race corrupted (a carry-over read from the wrong slot, a slot overwritten too
early) shows as a mismatch. bf16/fp16 ties are forgiven within `tie_margin` logits (a batch
of another shape rounds differently: see TIE_MARGIN); fp32 is held to a tight margin.

Each chunk is queued on the compute stream between steps, one per step boundary, and read
back through an event the CPU only queries: the step loop never waits for a check while it
has steps to run. Never decides what runs, never touches the engine's KV cache or token
table, never raises into the step loop (a check that fails is counted as skipped and logged).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.attention.interface import AttnContext
from engine.config import check_live_setting
from engine.core.request import Request
from engine.model.hf_config import kv_cache_shape
from engine.step.streams import Event, Stream
from telemetry.stalls import SENTINEL_CHECK

log = logging.getLogger("gapless.sentinel")

MAX_QUEUED = 256  # sampled requests waiting for a check; more are dropped (and counted)
# A produced token may trail the re-score's argmax by rel * |top logit| + abs before it counts
# as a mismatch: rounding that depends on the batch's shape scales with the logits' size.
TIE_MARGIN = {torch.float32: (1e-4, 1e-4), torch.float16: (0.02, 0.02),
              torch.bfloat16: (0.02, 0.02)}
CHECKED_REASONS = ("stop", "length")


@dataclass(slots=True)
class Mismatch:
    request_id: str
    index: int  # output token index
    produced: int
    expected: int  # the re-score's argmax
    gap: float  # logits between the argmax and the produced token


@dataclass(slots=True)
class _Check:
    request_id: str
    tokens: list[int]  # prompt + output
    prompt_len: int
    start: int = 0  # next position to score
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    gaps: list[torch.Tensor] = field(default_factory=list)  # per chunk [2, n]: gap, excess
    expected: list[torch.Tensor] = field(default_factory=list)
    event: Event | None = None  # the last queued chunk is done


class Sentinel:
    """Construct with the model, its attention backend, the compute stream and an event
    factory; `offer` every finished request, `poll` at every step boundary."""

    def __init__(self, *, model: torch.nn.Module, backend: Callable[..., torch.Tensor],
                 stream: Stream, event: Callable[[], Event], device: torch.device,
                 dtype: torch.dtype, chunk_tokens: int, block_size: int,
                 sample_every: int = 0) -> None:
        self.model = model
        self.backend = backend
        self.stream = stream
        self.new_event = event
        self.device = device
        self.dtype = dtype
        self.chunk_tokens = chunk_tokens
        self.block_size = block_size
        self.sample_every = sample_every
        self.tie_margin = TIE_MARGIN.get(dtype, TIE_MARGIN[torch.bfloat16])
        self.eligible = 0  # finished greedy requests seen while on
        self.checked = 0
        self.mismatches = 0  # requests with at least one mismatched token
        self.tokens_checked = 0
        self.tokens_mismatched = 0
        self.ties = 0  # produced tokens within tie_margin of a different argmax
        self.skipped = 0  # sampled but not checked (queue full, or the check failed)
        self.last_mismatch: Mismatch | None = None
        self._queue: deque[_Check] = deque()
        # Told of each chunk's run (cause, start ns, end ns, label) where it runs on the host
        # (host-emulated streams), so a step it delays is named for it (engine.instruments.
        # stall_watch); on CUDA the run only queues the work. None: nobody listens.
        self.mark: Callable[[str, int, int, str], None] | None = None

    # ----------------------------------------------------------------------- intake
    @property
    def busy(self) -> bool:
        return bool(self._queue)

    def offer(self, req: Request) -> None:
        """A request finished: sample it when it is greedy and ended normally."""
        n = self.sample_every
        if (not n or req.finish_reason not in CHECKED_REASONS or req.error is not None
                or req.params.temperature != 0 or not req.output_token_ids):
            return
        self.eligible += 1
        if self.eligible % n:
            return
        if len(self._queue) >= MAX_QUEUED:
            self.skipped += 1
            return
        self._queue.append(_Check(req.request_id, req.prompt_token_ids + req.output_token_ids,
                                  req.prompt_len))

    # ------------------------------------------------------------------------ checks
    def poll(self, wait: bool = False) -> None:
        """Read the chunk that finished, queue the next one. With `wait`, block for the
        chunk in flight first (when the engine is idle, or before it reconfigures)."""
        if not self._queue:
            return
        check = self._queue[0]
        if check.event is not None:
            if not wait and not check.event.query():
                return
            try:
                check.event.synchronize()
            except Exception as e:  # the forward raised on the stream
                self._give_up(check, e)
                return
            check.event = None
            if check.start >= len(check.tokens) - 1:
                self._queue.popleft()
                self._judge(check)
                return
        try:
            self._launch(check)
        except Exception as e:  # launching on CUDA raises here
            self._give_up(check, e)

    def drain(self) -> None:
        """Finish every queued check (reconfigure, shutdown, tests)."""
        while self._queue:
            self.poll(wait=True)

    def _give_up(self, check: _Check, error: BaseException) -> None:
        log.warning("sentinel: checking %s failed: %s", check.request_id, error)
        if self._queue and self._queue[0] is check:
            self._queue.popleft()
        self.skipped += 1

    def _launch(self, check: _Check) -> None:
        start = check.start
        end = min(len(check.tokens) - 1, start + self.chunk_tokens)  # the last token is
        check.start = end                                             # never an input
        event = self.new_event()

        def run() -> None:
            t0 = time.perf_counter_ns()
            with torch.inference_mode():
                gap, expected = self._score(check, start, end)
            check.gaps.append(gap)
            check.expected.append(expected)
            if self.mark is not None:
                self.mark(SENTINEL_CHECK, t0, time.perf_counter_ns(),
                          f"sentinel re-scored {end - start} tokens of {check.request_id}")

        self.stream.submit(run)
        self.stream.record(event)
        check.event = event

    def _score(self, check: _Check, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward positions start..end-1 (K/V of the earlier ones are cached); for each that
        predicts an output token, the logit gap to the argmax and the argmax (on the host)."""
        dev = self.device
        if not check.kv:
            layers, kv_heads, head_dim = kv_cache_shape(self.model.config)
            blocks = -(-len(check.tokens) // self.block_size)
            shape = (blocks, self.block_size, kv_heads, head_dim)
            check.kv = [(torch.zeros(shape, dtype=self.dtype, device=dev),
                         torch.zeros(shape, dtype=self.dtype, device=dev))
                        for _ in range(layers)]
        blocks = check.kv[0][0].shape[0]
        pos = torch.arange(start, end, dtype=torch.int32, device=dev)
        ctx = AttnContext(
            kv_caches=check.kv,
            slot_mapping=pos.long(),
            block_tables=torch.arange(blocks, dtype=torch.int32, device=dev)[None],
            token_req=torch.zeros(end - start, dtype=torch.int32, device=dev),
            token_pos=pos,
            backend=self.backend,
        )
        first = max(start, check.prompt_len - 1)  # the first position predicting an output
        ids = _to_device(check.tokens[start:end], dev)
        if first >= end:  # prompt only: fill the cache
            keep = torch.zeros(1, dtype=torch.long, device=dev)
            self.model(input_ids=ids[None], position_ids=pos[None], logits_to_keep=keep,
                       use_cache=False, gapless=ctx)
            empty = torch.zeros(0)
            return empty.view(2, 0), empty.long()
        keep = torch.arange(first - start, end - start, device=dev)
        logits = self.model(input_ids=ids[None], position_ids=pos[None], logits_to_keep=keep,
                            use_cache=False, gapless=ctx).logits[0].float()
        produced = _to_device(check.tokens[first + 1:end + 1], dev)
        top, expected = logits.max(dim=-1)
        gap = top - logits.gather(1, produced[:, None]).squeeze(1)
        rel, abs_ = self.tie_margin
        excess = gap - (rel * top.abs() + abs_)  # > 0: beyond a tie
        return _to_host(torch.stack([gap, excess])), _to_host(expected)

    def _judge(self, check: _Check) -> None:
        gaps, excess = torch.cat(check.gaps, dim=1).tolist()
        expected = torch.cat(check.expected).tolist()
        produced = check.tokens[check.prompt_len:]
        assert len(gaps) == len(produced), (len(gaps), len(produced))
        bad = [i for i, e in enumerate(excess) if e > 0]
        self.ties += sum(1 for i, e in enumerate(excess)
                         if e <= 0 and expected[i] != produced[i])
        self.checked += 1
        self.tokens_checked += len(produced)
        if bad:
            i = bad[0]
            self.mismatches += 1
            self.tokens_mismatched += len(bad)
            self.last_mismatch = Mismatch(check.request_id, i, produced[i], expected[i], gaps[i])
            log.error("sentinel: request %s output token %d was %d, the synchronous re-score "
                      "says %d (%.3f logits apart; %d of %d tokens differ)", check.request_id,
                      i, produced[i], expected[i], gaps[i], len(bad), len(produced))

    def stats(self) -> dict[str, int]:
        return {
            "sentinel_sample_every": self.sample_every,
            "sentinel_checked": self.checked,
            "sentinel_mismatches": self.mismatches,
            "sentinel_tokens_checked": self.tokens_checked,
            "sentinel_tokens_mismatched": self.tokens_mismatched,
            "sentinel_ties": self.ties,
            "sentinel_skipped": self.skipped,
            "sentinel_queued": len(self._queue),
        }


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """Token ids on the device without a host sync (pinned and asynchronous on CUDA: a
    pageable copy would wait for the step the device is running)."""
    x = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return x
    return x.pin_memory().to(device, non_blocking=True)


def _to_host(x: torch.Tensor) -> torch.Tensor:
    """A copy on the host that is complete once the stream has passed this point (pinned and
    asynchronous on CUDA, so queueing it never waits for the device)."""
    if x.device.type != "cuda":
        return x.cpu()
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    return host


def check_sample_every(value: Any) -> int:
    """Validate a `sentinel_sample_every` value (engine.config owns its legal values)."""
    check_live_setting("sentinel_sample_every", value)
    return value
