"""The public engine: submit, stream, generate, abort, configure, shut down.

Owns the boundary: validating prompts and sampling params (ValueError that says what is
allowed, and the engine keeps serving), request handles, and the loop thread that runs
the StepLoop. Commands from other threads queue up and apply at the next step boundary.
Never imports UI code.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from engine.attention.interface import resolve_backend
from engine.config import EngineConfig, SamplingParams
from engine.core.batch import BufferLayout
from engine.core.block_allocator import BlockAllocator, blocks_needed
from engine.core.request import Request, RequestOutput
from engine.core.scheduler import Scheduler
from engine.model import loader
from engine.model.hf_config import text_config
from engine.step.graphs import GraphCache, default_buckets
from engine.step.loop import LiveSettings, RequestSink, StepLoop
from engine.step.runner import ModelRunner
from engine.step.streams import StreamSet
from telemetry.bus import TelemetryBus

log = logging.getLogger("gapless.engine")

PromptInput = str | list[int]


DeltaCallback = Callable[[str, str], None]
FinishCallback = Callable[[RequestOutput], None]


class RequestHandle:
    """Returned by submit(). Iterate it for text deltas; result() waits for the end."""

    def __init__(self, request_id: str, on_delta: DeltaCallback | None = None,
                 on_finish: FinishCallback | None = None) -> None:
        self.request_id = request_id
        self.on_delta = on_delta
        self.on_finish = on_finish
        self._deltas: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._done = threading.Event()
        self._output: RequestOutput | None = None

    def __iter__(self) -> Iterator[str]:
        while True:
            d = self._deltas.get()
            if d is None:
                return
            yield d

    def result(self, timeout: float | None = None) -> RequestOutput:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish in {timeout} s")
        assert self._output is not None
        return self._output

    @property
    def done(self) -> bool:
        return self._done.is_set()


class _Sink(RequestSink):
    def __init__(self) -> None:
        self.handles: dict[str, RequestHandle] = {}

    @property
    def num_open(self) -> int:
        return len(self.handles)

    def on_delta(self, req: Request, text: str) -> None:
        h = self.handles.get(req.request_id)
        if h is not None:
            h._deltas.put(text)
            if h.on_delta is not None:
                _call(h.on_delta, req.request_id, text)

    def on_finish(self, req: Request) -> None:
        h = self.handles.pop(req.request_id, None)
        if h is None:
            return
        h._output = output_of(req)
        h._deltas.put(None)
        h._done.set()
        if h.on_finish is not None:
            _call(h.on_finish, h._output)


def _call(fn: Callable[..., None], *args: Any) -> None:
    """Callbacks run on the engine's loop thread: one that raises is logged, never fatal."""
    try:
        fn(*args)
    except Exception:
        log.exception("request callback %r raised", fn)


def _stable_seed(engine_seed: int, request_id: str) -> int:
    """A per-request seed that is the same in every process (str hash() is not)."""
    return zlib.crc32(f"{engine_seed}:{request_id}".encode()) & 0x7FFFFFFF


def output_of(req: Request) -> RequestOutput:
    metrics: dict[str, float] = {}
    if req.first_token_ns is not None:
        metrics["ttft_s"] = (req.first_token_ns - req.arrival_ns) / 1e9
    if req.finished_ns is not None:
        metrics["e2e_s"] = (req.finished_ns - req.arrival_ns) / 1e9
        if req.first_token_ns is not None and len(req.output_token_ids) > 1:
            decode_s = (req.finished_ns - req.first_token_ns) / 1e9
            metrics["decode_tokens_per_s"] = (len(req.output_token_ids) - 1) / max(decode_s, 1e-9)
    return RequestOutput(req.request_id, list(req.prompt_token_ids), list(req.output_token_ids),
                         req.text, req.finish_reason, req.error, metrics)


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        start: bool = True,
    ) -> None:
        config.validate()
        self.config = config
        self.device = loader.resolve_device(config.device)
        self.dtype = loader.resolve_dtype(config.dtype, self.device)
        owned = model is None
        if model is None:
            model, tok = loader.load_model_and_tokenizer(config, self.device, self.dtype)
            tokenizer = tokenizer or tok
        else:
            model = loader.prepare_model(model, self.device, self.dtype)
        text_cfg = text_config(model.config)
        self.vocab_size = int(text_cfg.vocab_size)
        self.max_model_len = config.max_model_len or min(
            int(getattr(text_cfg, "max_position_embeddings", 4096) or 4096), 4096)
        model, self.model_impl = loader.select_model_impl(model, config.model_impl,
                                                          self.max_model_len, owned)
        self.model, self.tokenizer = model, tokenizer
        self.backend_name, backend = resolve_backend(config.attention_backend, self.device)
        num_blocks = self._num_blocks(model.config)
        # The last block is scratch: padding tokens of graph steps write their K/V there.
        allocator = BlockAllocator(num_blocks - 1)
        self.scheduler = Scheduler(allocator, config.block_size, config.max_num_seqs,
                                   config.max_num_batched_tokens, self.max_model_len)
        self.runner = ModelRunner(model, backend, self.device, self.dtype, num_blocks,
                                  config.block_size, config.max_num_seqs, self.max_model_len)
        layout = BufferLayout(config.max_num_batched_tokens, config.max_num_seqs,
                              blocks_needed(self.max_model_len, config.block_size))
        self.streams = StreamSet(self.device)
        graphs, unavailable = None, None
        if self.device.type != "cuda":
            unavailable = "CUDA graphs need a CUDA GPU; this engine runs on the CPU"
        elif self.backend_name != "triton":
            unavailable = "CUDA graphs need the triton attention backend (torch is not graph-safe)"
        else:
            buckets = config.graph_buckets or default_buckets(config.max_num_batched_tokens)
            buckets = [b for b in buckets if b <= config.max_num_batched_tokens]
            graphs = GraphCache(buckets, self.runner.compute,
                                self.streams.compute.stream,  # type: ignore[attr-defined]
                                config.max_num_seqs)
        self.bus = TelemetryBus(enabled=config.telemetry)
        self._sink = _Sink()
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        if eos is None:
            eos = getattr(tokenizer, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        settings = LiveSettings(config.async_batching, config.num_slots,
                                config.cuda_graphs and graphs is not None)
        self.loop = StepLoop(
            self.runner, self.scheduler, self.streams, layout, settings, graphs, unavailable,
            self.bus if config.telemetry else None, self._sink, tokenizer, eos_ids,
            self.max_model_len, config.block_size, (num_blocks - 1) * config.block_size,
        )
        self._ids = itertools.count()
        self._requests: dict[str, Request] = {}
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue[tuple[str, Any, threading.Event | None]] = (
            queue.SimpleQueue())
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="gapless-engine", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------------- sizing
    def _num_blocks(self, hf_config: Any) -> int:
        cfg = self.config
        per_req = blocks_needed(self.max_model_len, cfg.block_size)
        enough = cfg.max_num_seqs * per_req + 1
        if cfg.num_blocks is not None:
            n = cfg.num_blocks
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            per_block = ModelRunner.kv_bytes_per_block(hf_config, cfg.block_size, self.dtype)
            n = min(enough, int(free * cfg.gpu_memory_fraction) // per_block)
        else:
            n = enough
        if n - 1 < per_req:
            raise ValueError(
                f"num_blocks={n} is too small: one request of max_model_len="
                f"{self.max_model_len} needs {per_req} blocks of {cfg.block_size} tokens "
                f"(plus one scratch block); give num_blocks >= {per_req + 1}"
            )
        return n

    # ------------------------------------------------------------------------ requests
    def submit(self, prompt: PromptInput, params: SamplingParams | dict | None = None,
               request_id: str | None = None, on_delta: DeltaCallback | None = None,
               on_finish: FinishCallback | None = None) -> RequestHandle:
        """Queue a request; returns at once. on_delta(request_id, text) and
        on_finish(output) are called on the engine's loop thread: keep them quick."""
        if self._stop:
            raise RuntimeError("the engine is shut down")
        params = SamplingParams.coerce(params)
        params.validate()
        if params.detokenize and self.tokenizer is None:
            raise ValueError("this engine has no tokenizer: submit with detokenize=False")
        ids = self._prompt_ids(prompt)
        rid = request_id or f"req-{next(self._ids)}"
        seed = params.seed if params.seed is not None else _stable_seed(self.config.seed, rid)
        req = Request(rid, ids, params, seed, time.perf_counter_ns())
        handle = RequestHandle(rid, on_delta, on_finish)
        with self._lock:
            if rid in self._requests:
                raise ValueError(f"request id {rid!r} is already in use")
            self._sink.handles[rid] = handle
            self._requests[rid] = req
        self._command("add", req)
        return handle

    def _prompt_ids(self, prompt: PromptInput) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: give prompts as token id lists")
            if not prompt:
                raise ValueError("prompt is empty; give a non-empty string or token id list")
            ids = list(self.tokenizer(prompt)["input_ids"])
            if not ids:
                raise ValueError("prompt tokenizes to no tokens; give a longer prompt")
        elif isinstance(prompt, (list, tuple)):
            if not prompt:
                raise ValueError("prompt is empty; give a non-empty string or token id list")
            for t in prompt:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise ValueError(f"prompt token ids must be integers, got {t!r}")
                if not 0 <= t < self.vocab_size:
                    raise ValueError(
                        f"prompt token id {t} is outside the vocabulary [0, {self.vocab_size})"
                    )
            ids = list(prompt)
        else:
            raise ValueError(
                f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
            )
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}, so a "
                f"prompt may have at most {self.max_model_len - 1} tokens"
            )
        return ids

    def generate(self, prompts: PromptInput | list[PromptInput],
                 params: SamplingParams | dict | list[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        plist = params if isinstance(params, list) else [params] * len(prompts)
        handles = [self.submit(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        if self._thread is None:
            while not all(h.done for h in handles):
                self.step()
        return [h.result() for h in handles]

    def abort(self, request_id: str) -> None:
        self._command("abort", request_id)

    # -------------------------------------------------------------------- live control
    def configure(self, async_batching: bool | None = None, num_slots: int | None = None,
                  cuda_graphs: bool | None = None) -> dict[str, Any]:
        """Change live settings; they take effect at the next step boundary (the pipeline
        drains first). Returns the settings in force afterwards."""
        if async_batching is not None and not isinstance(async_batching, bool):
            raise ValueError(f"async_batching must be true or false, got {async_batching!r}")
        if num_slots is not None and (isinstance(num_slots, bool) or num_slots not in (1, 2, 3)):
            raise ValueError(f"num_slots must be 1, 2 or 3, got {num_slots!r}")
        if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be true or false, got {cuda_graphs!r}")
        if self._stop:
            raise RuntimeError("the engine is shut down")
        if cuda_graphs and self.loop.graphs is None:
            raise ValueError(f"cuda_graphs cannot be turned on: {self.loop.graphs_reason()}")
        done = threading.Event()
        self._command("configure", (async_batching, num_slots, cuda_graphs), done)
        if self._thread is not None:
            done.wait()
        else:
            self._apply_commands()
        return self.settings()

    def settings(self) -> dict[str, Any]:
        s = self.loop.settings
        return {
            "async_batching": s.async_batching,
            "num_slots": s.num_slots,
            "cuda_graphs": self.loop.graphs_active,
            "cuda_graphs_available": self.loop.graphs is not None and not self.loop.graphs.failure,
            "cuda_graphs_reason": self.loop.graphs_reason(),
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "model": self.config.model,
            "attention_backend": self.backend_name,
            "model_impl": self.model_impl,
            "max_num_seqs": self.config.max_num_seqs,
            "max_num_batched_tokens": self.config.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "block_size": self.config.block_size,
            "telemetry": self.config.telemetry,
        }

    def stats(self) -> dict[str, int]:
        sch = self.scheduler
        return {
            "running": len(sch.running),
            "waiting": len(sch.waiting),
            "kv_blocks_used": sch.allocator.num_used,
            "kv_blocks_total": sch.allocator.num_blocks,
            "steps": self.loop.step_no,
            "generated_tokens": self.loop.generated_tokens,
            "discarded_tokens": self.loop.discarded_tokens,
            "preemptions": sch.total_preemptions,
            # Submitted and not finished, including requests not yet picked up by the loop.
            "unfinished": self._sink.num_open,
        }

    # ---------------------------------------------------------------------- the loop
    def _command(self, kind: str, arg: Any, done: threading.Event | None = None) -> None:
        self._commands.put((kind, arg, done))
        self._wake.set()

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, arg, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                if kind == "add":
                    self.scheduler.add(arg)
                    self.loop._event(arg, "queued")
                elif kind == "abort":
                    with self._lock:
                        req = self._requests.get(arg)
                    if req is not None and not req.is_finished:
                        self.loop.finish(req, "abort")
                elif kind == "configure":
                    self.loop.reconfigure(*arg)
            finally:
                if done is not None:
                    done.set()

    def step(self) -> bool:
        """One step boundary: apply commands, then schedule/launch/read. For manual driving
        (Engine(..., start=False)); the loop thread calls it otherwise."""
        self._apply_commands()
        worked = self.loop.step()
        self._forget_finished()
        return worked

    def _forget_finished(self) -> None:
        if len(self._requests) > 1024:
            with self._lock:
                for rid in [r for r, q in self._requests.items() if q.is_finished]:
                    del self._requests[rid]

    def _run(self) -> None:
        while not self._stop:
            try:
                worked = self.step()
            except Exception as e:  # keep serving: fail what was running, log, go on
                log.exception("engine step failed")
                for req in list(self.scheduler.running) + list(self.scheduler.waiting):
                    req.error = f"{type(e).__name__}: {e}"
                    self.loop.finish(req, "error")
                # A launched step's slot still holds it: the next step on that slot reads it
                # first (its requests are finished, so its tokens are discarded).
                self.loop.inflight = None
                worked = True
            if not worked:
                self._wake.wait(0.05)
                self._wake.clear()

    def shutdown(self) -> None:
        if self._stop:
            return
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._apply_commands()
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.loop.finish(req, "abort")
        self.loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
