"""Per-request accounting behind vLLM's request series: what each RequestEvent adds, and when.

Owns the moment each ``vllm:`` request figure is counted, as vLLM's V1 engine counts it
(``vllm/v1/metrics/stats.py``):

- prompt tokens when the request's first token comes out (its prefill is done), not when it
  is queued, so a burst of queued requests does not count prompts that are never prefilled;
- time to first token and inter-token latency while the request runs (one inter-token sample
  per token event, the wait since the previous one), aborted requests included;
- once a request finishes by ``stop`` or ``length``: request_success{finished_reason}, the
  end-to-end, queue (queued -> first scheduled), prefill (first scheduled -> first token),
  decode (first token -> last token) and inference (first scheduled -> last token) times, and
  its prompt / generation token counts. vLLM records none of these for a request its client
  aborted; we count those in gapless:requests_aborted_total, and requests that ended in an
  error in gapless:requests_failed_total{reason}: "error" (a failed step, a tokenizer or
  callback error) or "engine_dead" (the engine process died with the request unfinished:
  the client's "finished" event with that reason for each of its own requests, whose other
  events may have died with the engine, and ``engine_gone`` for the rest).

Times come from the engine's own event timestamps (one clock). It must never call the engine
and never raise on an event it cannot place (a request seen half-way is skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.serving import metric_names as mn
from telemetry.records import RequestEvent

MAX_TRACKED = 100_000  # requests followed at once (the oldest is forgotten beyond)
FAILURE_REASONS = ("error", "engine_dead")


@dataclass(slots=True)
class _Life:
    queued_ns: int
    prompt_tokens: int
    scheduled_ns: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    generated: int = 0


class RequestMetrics:
    """vLLM's per-request series for one served model, fed RequestEvents in order."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        labels = list(mn.LABELS)
        values = (model_name, mn.ENGINE_INDEX)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets,
                             registry=registry).labels(*values)

        tokens = mn.buckets_1_2_5(max_model_len)
        self.prompt_tokens = Counter(mn.PROMPT_TOKENS, "Number of prefill tokens processed "
                                     "(a request's prompt, counted at its first token).",
                                     labels, registry=registry).labels(*values)
        success = Counter(mn.REQUEST_SUCCESS, "Count of successfully processed requests "
                          "(client-aborted requests are not counted: see "
                          "gapless:requests_aborted_total).", labels + ["finished_reason"],
                          registry=registry)
        self.success = {r: success.labels(*values, r) for r in mn.FINISHED_REASONS}
        self.ttft = hist(mn.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in "
                         "seconds (queued to first token).", mn.TTFT_BUCKETS)
        self.itl = hist(mn.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in "
                        "seconds.", mn.ITL_BUCKETS)
        lat = mn.REQUEST_LATENCY_BUCKETS
        self.e2e = hist(mn.E2E_LATENCY, "Histogram of e2e request latency in seconds.", lat)
        self.queue = hist(mn.QUEUE_TIME, "Histogram of time spent in WAITING phase for "
                          "request.", lat)
        self.inference = hist(mn.INFERENCE_TIME, "Histogram of time spent in RUNNING phase "
                              "for request.", lat)
        self.prefill = hist(mn.PREFILL_TIME, "Histogram of time spent in PREFILL phase for "
                            "request.", lat)
        self.decode = hist(mn.DECODE_TIME, "Histogram of time spent in DECODE phase for "
                           "request.", lat)
        self.req_prompt = hist(mn.REQUEST_PROMPT_TOKENS, "Number of prefill tokens "
                               "processed.", tokens)
        self.req_generation = hist(mn.REQUEST_GENERATION_TOKENS, "Number of generation "
                                   "tokens processed.", tokens)
        self.max_generation = hist(mn.MAX_NUM_GENERATION_TOKENS, "Histogram of maximum "
                                   "number of requested generation tokens (n = 1: the "
                                   "request's own).", tokens)
        self.aborted = Counter("gapless:requests_aborted", "Requests aborted before they "
                               "finished (a client that went away, or an abort call); "
                               "vLLM's request series leave them out.", registry=registry)
        failed = Counter("gapless:requests_failed", "Requests that ended in an error: "
                         "reason=error (a failed step, a tokenizer or callback error), "
                         "reason=engine_dead (the engine process died first).", ["reason"],
                         registry=registry)
        self.failed = {r: failed.labels(r) for r in FAILURE_REASONS}
        self._lives: dict[str, _Life] = {}

    def engine_gone(self) -> int:
        """The engine process died (or was replaced): every request still followed ended
        with it; count them and forget them. Returns how many."""
        n = len(self._lives)
        if n:
            self.failed["engine_dead"].inc(n)
        self._lives.clear()
        return n

    def on_event(self, ev: RequestEvent) -> None:
        if ev.kind == "finished" and ev.reason == "engine_dead":
            # The client's, for a request the engine died with: counted whether or not its
            # other events left the engine.
            self._lives.pop(ev.request_id, None)
            self.failed["engine_dead"].inc()
            return
        life = self._lives.get(ev.request_id)
        if ev.kind == "queued":
            if len(self._lives) >= MAX_TRACKED:
                self._lives.pop(next(iter(self._lives)))
            self._lives[ev.request_id] = _Life(ev.t_ns, ev.prompt_tokens)
            return
        if life is None:  # queued before this server started reading, or dropped
            return
        if ev.kind == "scheduled":
            if life.scheduled_ns is None:  # a preempted request's later schedules don't count
                life.scheduled_ns = ev.t_ns
        elif ev.kind in ("first_token", "tokens") and ev.num_tokens > 0:
            if life.first_ns is None:
                self.prompt_tokens.inc(life.prompt_tokens)
                self.ttft.observe((ev.t_ns - life.queued_ns) / 1e9)
                life.first_ns = ev.t_ns
            else:
                self.itl.observe((ev.t_ns - (life.last_ns or life.first_ns)) / 1e9)
            life.last_ns = ev.t_ns
            life.generated += ev.num_tokens
        elif ev.kind == "finished":
            del self._lives[ev.request_id]
            self._on_finished(life, ev)

    def _on_finished(self, life: _Life, ev: RequestEvent) -> None:
        if ev.reason == "abort":
            self.aborted.inc()
            return
        if ev.reason not in ("stop", "length"):
            self.failed["error"].inc()
            return
        scheduled = life.scheduled_ns if life.scheduled_ns is not None else life.queued_ns
        first = life.first_ns if life.first_ns is not None else ev.t_ns
        last = life.last_ns if life.last_ns is not None else first
        self.success[ev.reason].inc()
        self.e2e.observe((ev.t_ns - life.queued_ns) / 1e9)
        self.queue.observe((scheduled - life.queued_ns) / 1e9)
        self.prefill.observe((first - scheduled) / 1e9)
        self.decode.observe((last - first) / 1e9)
        self.inference.observe((last - scheduled) / 1e9)
        self.req_prompt.observe(life.prompt_tokens)
        self.req_generation.observe(life.generated)
        self.max_generation.observe(life.generated)
