"""The public engine: submit, stream, generate, abort, configure, shut down.

Owns the boundary: validating prompts and sampling params (ValueError that says what is
allowed, and the engine keeps serving), request handles, the loop thread that runs the
StepLoop, and live control: the settings that change at the next step boundary (async
batching, slots, CUDA graphs, the sentinel, the token budget), their version, and what
settings() and stats() report. Commands from other threads queue up and apply at the next
step boundary; a change never touches a step in flight. Never imports UI code.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import queue
import threading
import time
import zlib
from concurrent.futures import Future
from typing import Any

import torch

from engine import inputs
from engine.attention.interface import resolve_backend
from engine.config import (
    EngineConfig,
    SamplingParams,
    check_live_setting,
    check_token_budget,
    token_budget_range,
)
from engine.core.batch import BufferLayout
from engine.core.block_allocator import BlockAllocator, blocks_needed
from engine.core.request import Request, RequestOutput
from engine.core.scheduler import Scheduler
from engine.handles import DeltaCallback, FinishCallback, HandleSink, RequestHandle
from engine.inputs import PromptInput
from engine.instruments.floor_probe import engine_curve
from engine.instruments.kernel_sampler import KernelSampler
from engine.instruments.observer import Instruments
from engine.instruments.sentinel import Sentinel
from engine.instruments.stall_watch import StallWatch
from engine.instruments.step_floor import live_floor
from engine.model import loader
from engine.model.blas import apply_blas_library
from engine.model.hf_config import text_config
from engine.parallel.leader import TPLeader
from engine.sizing import check_fits, kv_bytes_per_block, num_blocks_for
from engine.step import heap
from engine.step.graphs import GraphCache, default_buckets
from engine.step.loop import LiveSettings, StepLoop, describe
from engine.step.runner import ModelRunner
from engine.step.streams import StreamSet
from telemetry.bus import TelemetryBus
from telemetry.records import SyncFallback
from telemetry.stalls import ENGINE_COMMAND

log = logging.getLogger("gapless.engine")

__all__ = ["Engine", "RequestHandle", "PromptInput"]


def _stable_seed(engine_seed: int, request_id: str) -> int:
    """A per-request seed that is the same in every process (str hash() is not)."""
    return zlib.crc32(f"{engine_seed}:{request_id}".encode()) & 0x7FFFFFFF


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
        # Tensor parallelism: rank 0 here; the other ranks start once the model is checked.
        self.tp: TPLeader | None = None
        if config.tensor_parallel_size > 1:
            if model is not None:
                raise ValueError(
                    f"tensor_parallel_size={config.tensor_parallel_size} loads the checkpoint in "
                    "every rank from the model setting; an in-memory model cannot be sharded "
                    "across processes: pass model=None (or tensor_parallel_size 1)")
            self.tp = TPLeader(config, self.device)
        try:
            self._build(model, tokenizer)
        except BaseException:
            if self.tp is not None:
                self.tp.close()
            raise
        self._ids = itertools.count()
        # Bumped by each configure() that changes a live setting: clients compare-and-set on
        # it (engine.process.commands), so a change made on a stale view is refused.
        self.settings_version = 0
        # Guards the open-request registry and the order of commands: a request's "add" is
        # queued in the same critical section that registers it, so an abort that finds it
        # is always queued after it.
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue[tuple[str, Any, Future | None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self.dead_reason: str | None = None
        self._thread: threading.Thread | None = None
        heap.settle()  # the model is loaded, the graphs captured: keep full GCs short
        self._settled = True
        if start:
            self._thread = threading.Thread(target=self._run, name="gapless-engine", daemon=True)
            self._thread.start()

    def _build(self, model: torch.nn.Module | None, tokenizer: Any) -> None:
        """Load (or take) the model, size and allocate the device state, make the loop."""
        config, tp = self.config, self.tp
        owned = model is None
        if model is None:
            model, tok = loader.load_model_and_tokenizer(
                config, self.device if tp is None else tp.load_device, self.dtype)
            tokenizer = tokenizer or tok
        else:
            model = loader.prepare_model(model, self.device, self.dtype)
        text_cfg = text_config(model.config)
        self.vocab_size = int(text_cfg.vocab_size)
        self.max_model_len = _max_model_len(config, text_cfg)
        if tp is not None:
            model, self.model_impl = tp.shard(model, self.max_model_len), "gapless"
        else:
            model, self.model_impl = loader.select_model_impl(model, config.model_impl,
                                                              self.max_model_len, owned)
        if hasattr(model, "set_fused_path"):  # the gapless decode layer's kernels
            from engine.model.llama import FusedPath

            model.set_fused_path(FusedPath.from_config(config))
        self.decode_layer = model.fused_path_summary() if hasattr(model, "set_fused_path") \
            else None
        self.model, self.tokenizer = model, tokenizer
        self.blas_library = apply_blas_library(config.blas_library, self.device)
        self.backend_name, backend = resolve_backend(config.attention_backend, self.device)
        n_tp = config.tensor_parallel_size
        # Compiles only the generic path ('auto' may have picked our fused forward).
        self.torch_compile = config.torch_compile and self.model_impl == "transformers"
        if self.torch_compile:
            from engine.model.compiled import compile_forward

            model, backend = compile_forward(model, self.backend_name, backend)
        # Every rank's share together: what a token's KV costs to read (the request ledger).
        self.kv_bytes_per_token = kv_bytes_per_block(model.config, 1, self.dtype)
        # The bandwidth curve of the byte floor and the separate-kernel reference: this GPU's,
        # cached on disk per GPU model, driver and torch; measured only where there is none
        # yet, before the KV cache takes the free memory. None on a CPU.
        self.floor_curve = engine_curve(self.device)
        num_blocks = num_blocks_for(config, model.config, self.max_model_len, self.device,
                                    self.dtype, tp_size=n_tp)
        # On the CPU every rank's share comes out of the same memory.
        check_fits(config, model.config, num_blocks, self.max_model_len, self.device, self.dtype,
                   tp_size=n_tp if self.device.type == "cuda" else 1)
        self.runner = ModelRunner(model, backend, self.device, self.dtype, num_blocks,
                                  config.block_size, config.max_num_seqs, self.max_model_len,
                                  tp=None if tp is None else tp.comm)
        # The prefix cache's extra key: what else changes a block's KV for the same tokens.
        identity = f"{config.model}|{self.model_impl}|{self.dtype}|{config.block_size}"
        allocator = BlockAllocator(self.runner.num_cache_blocks, block_size=config.block_size,
                                   prefix_caching=config.prefix_caching,
                                   extra_key=zlib.crc32(identity.encode()))
        self.scheduler = Scheduler(allocator, config.block_size, config.max_num_seqs,
                                   config.max_num_batched_tokens, self.max_model_len)
        self.streams = StreamSet(self.device)
        graphs, unavailable = None, None
        if self.device.type != "cuda":
            unavailable = "CUDA graphs need a CUDA GPU; this engine runs on the CPU"
        elif self.backend_name != "triton":
            unavailable = "CUDA graphs need the triton attention backend (torch is not graph-safe)"
        else:
            # EngineConfig.validate keeps every bucket within max_num_batched_tokens.
            graphs = GraphCache(config.graph_buckets or default_buckets(
                                    config.max_num_batched_tokens),
                                self.runner.compute,
                                self.streams.compute.stream,  # type: ignore[attr-defined]
                                config.max_num_seqs, timing=config.telemetry)
        self.bus = TelemetryBus(enabled=config.telemetry)
        # What watches the step: the kernel sampler (CUDA, telemetry on), the step anatomy
        # on demand, the sentinel (not under tensor parallelism).
        self.instruments = Instruments(
            cuda=self.streams.is_cuda,
            kernels=KernelSampler(enabled=self.streams.is_cuda and config.telemetry,
                                  period_s=config.kernel_sample_period_s),
            sentinel=None if tp is not None else Sentinel(
                model=model, backend=backend, stream=self.streams.compute,
                event=self.streams.event, device=self.device, dtype=self.dtype,
                chunk_tokens=config.max_num_batched_tokens, block_size=config.block_size,
                sample_every=config.sentinel_sample_every))
        self._sink = HandleSink()
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        if eos is None:
            eos = getattr(tokenizer, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tp is not None:  # the workers build theirs with the same sizes
            tp.build(num_blocks=num_blocks, max_model_len=self.max_model_len,
                     num_slots=config.num_slots,
                     graph_buckets=None if graphs is None else graphs.buckets,
                     to_host_ns=None if self.streams.clock is None else
                     self.streams.clock.to_host_ns)
        self.loop = StepLoop(
            runner=self.runner,
            scheduler=self.scheduler,
            streams=self.streams,
            layout=BufferLayout(config.max_num_batched_tokens, config.max_num_seqs,
                                blocks_needed(self.max_model_len, config.block_size)),
            settings=LiveSettings(config.async_batching, config.num_slots,
                                  config.cuda_graphs and graphs is not None),
            graphs=graphs,
            graphs_unavailable=unavailable,
            bus=self.instruments.publisher(self.bus) if config.telemetry else None,
            sink=self._sink,
            tokenizer=tokenizer,
            eos_ids=eos_ids,
            followers=tp,
            observer=self.instruments,
        )
        # (under TP the leader's model is its shard, and each rank reads its KV share)
        self.loop.byte_floor = live_floor(model, self.kv_bytes_per_token / max(1, n_tp),
                                          self.floor_curve)
        # Stalls: each record judged once, on the loop thread, before it is published.
        self.stall_watch = StallWatch(compute_thread=self.streams.compute_thread()) \
            if config.telemetry else None
        if self.stall_watch is not None:
            self.loop.judge_stall = self.stall_watch.observe
            self.loop.mark = self.stall_watch.add_mark
            if self.instruments.sentinel is not None:
                self.instruments.sentinel.mark = self.stall_watch.add_mark

    # ------------------------------------------------------------------- live control
    def configure(self, async_batching: bool | None = None, num_slots: int | None = None,
                  cuda_graphs: bool | None = None,
                  sentinel_sample_every: int | None = None,
                  max_num_batched_tokens: int | None = None) -> dict[str, Any]:
        """Change live settings; they take effect at the next step boundary (the pipeline
        drains first). Returns the settings in force afterwards."""
        changes = {"async_batching": async_batching, "num_slots": num_slots,
                   "cuda_graphs": cuda_graphs, "sentinel_sample_every": sentinel_sample_every}
        for key, value in changes.items():
            if value is not None:
                check_live_setting(key, value)
        if max_num_batched_tokens is not None:
            check_token_budget(max_num_batched_tokens, self.token_budget_range)
        if cuda_graphs and self.loop.graphs is None:
            raise ValueError(f"cuda_graphs cannot be turned on: {self.loop.graphs_reason()}")
        if sentinel_sample_every is not None:
            if sentinel_sample_every and self.instruments.sentinel is None:
                raise ValueError("the sentinel cannot be turned on with tensor_parallel_size > 1")
        before = self._live_settings()
        self._run_command("configure", (async_batching, num_slots, cuda_graphs,
                                        sentinel_sample_every, max_num_batched_tokens))
        if self._live_settings() != before:
            self.settings_version += 1
        return self.settings()

    def run_on_loop(self, fn: Any, timeout_s: float = 60.0) -> Any:
        """``fn()`` on the loop thread at the next step boundary (no launch of ours in
        progress on that thread); its result, or its exception raised here. For tools that
        must not act while the loop launches: a profiler session stopped from another thread
        while the loop thread was launching left that thread's kernel launches unrecorded
        in later sessions (bench/harness/truth_kick.py)."""
        return self._run_command("call", fn, timeout_s)

    def _run_command(self, kind: str, arg: Any, timeout_s: float | None = None) -> Any:
        """Queue a command for the next step boundary and wait for its result, noticing a
        loop that died or stopped meanwhile (then _check_serving raises)."""
        done: Future[Any] = Future()
        with self._lock:
            self._check_serving()
            self._command(kind, arg, done)
        if self._thread is None:
            self._apply_commands()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return done.result(timeout=0.1)
            except TimeoutError:
                self._check_serving()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the engine loop did not run the {kind!r} command "
                                       f"within {timeout_s:g} s") from None

    def _live_settings(self) -> tuple[Any, ...]:
        s = self.loop.settings
        return (s.async_batching, s.num_slots, self.loop.graphs_active,
                self.instruments.sentinel_sample_every, self.scheduler.max_num_batched_tokens)

    def settings(self) -> dict[str, Any]:
        s = self.loop.settings
        return {
            "async_batching": s.async_batching,
            "num_slots": s.num_slots,
            "cuda_graphs": self.loop.graphs_active,
            "cuda_graphs_available": self.loop.graphs is not None and not self.loop.graphs.failure,
            "cuda_graphs_reason": self.loop.graphs_reason(),
            "sentinel_sample_every": self.instruments.sentinel_sample_every,
            "settings_version": self.settings_version,
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "model": self.config.model,
            "attention_backend": self.backend_name,
            "model_impl": self.model_impl,
            "decode_layer": self.decode_layer,
            "blas_library": self.blas_library,
            "tensor_parallel_size": self.config.tensor_parallel_size,
            "torch_compile": self.torch_compile,
            "max_num_seqs": self.config.max_num_seqs,
            "max_num_batched_tokens": self.scheduler.max_num_batched_tokens,  # live
            "max_num_batched_tokens_range": list(self.token_budget_range),
            "max_model_len": self.max_model_len,
            "block_size": self.config.block_size,
            "prefix_caching": self.config.prefix_caching,
            "telemetry": self.config.telemetry,
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }

    def stats(self) -> dict[str, Any]:
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
            # Prefix cache (tokens): looked up at admission, and found cached there.
            "prefix_cache_queries": sch.allocator.queries,
            "prefix_cache_hits": sch.allocator.hits,
            "kv_blocks_cached": sch.allocator.num_cached,
            # Submitted and not finished, including requests not yet picked up by the loop.
            "unfinished": self._sink.num_open,
            **self.instruments.stats(),
        }

    @property
    def token_budget_range(self) -> tuple[int, int]:
        """The lowest and highest live max_num_batched_tokens (engine.config's rule)."""
        return token_budget_range(self.config.max_num_batched_tokens, self.config.max_num_seqs)

    def _reconfigure(self, async_batching: bool | None, num_slots: int | None,
                     cuda_graphs: bool | None, sentinel_sample_every: int | None,
                     max_num_batched_tokens: int | None) -> None:
        """On the loop thread, at a step boundary: the launched steps finish, then the
        sentinel's queued checks, then the settings change."""
        self.loop.drain(SyncFallback.LIVE_SETTINGS)
        if sentinel_sample_every is not None:
            self.instruments.set_sentinel_sample_every(sentinel_sample_every)
        else:
            self.instruments.drain()
        self.loop.reconfigure(async_batching, num_slots, cuda_graphs, max_num_batched_tokens)

    # ------------------------------------------------------------------------ requests
    def output_token_ids(self, request_id: str) -> list[int] | None:
        """The token ids an open request has produced so far, or None once it has ended. The
        list is the request's own and grows on the loop thread: read it from an on_delta
        callback (which runs there) or copy it."""
        req = self._sink.request(request_id)
        return None if req is None else req.output_token_ids

    def submit(self, prompt: PromptInput, params: SamplingParams | dict | None = None,
               request_id: str | None = None, on_delta: DeltaCallback | None = None,
               on_finish: FinishCallback | None = None) -> RequestHandle:
        """Queue a request; returns at once. on_delta(request_id, text) and
        on_finish(output) are called on the engine's loop thread: keep them quick. A callback
        that raises ends its own request with "error"."""
        self._check_serving()
        for name, cb in (("on_delta", on_delta), ("on_finish", on_finish)):
            if cb is not None and not callable(cb):
                raise ValueError(f"{name} must be a callable or None, got {type(cb).__name__}")
        req = self._prepare(prompt, params, request_id)
        handle = RequestHandle(req.request_id, on_delta, on_finish)
        handle.prompt_token_ids = list(req.prompt_token_ids)
        return self._enqueue([(req, handle)])[0]

    def _prepare(self, prompt: Any, params: Any, request_id: Any) -> Request:
        """Validate everything about one request; queue nothing."""
        sp = inputs.sampling_params(params, self.tokenizer, self.vocab_size)
        rid = None if request_id is None else inputs.check_request_id(request_id)
        ids = inputs.prompt_ids(prompt, self.tokenizer, self.vocab_size, self.max_model_len)
        return Request(rid or "", ids, sp, 0, time.perf_counter_ns())

    def _enqueue(self, batch: list[tuple[Request, RequestHandle]]) -> list[RequestHandle]:
        """Register and queue validated requests, all or none: an id in use refuses the
        whole batch. An id is in use from submit until its end was delivered."""
        open_ = self._sink.open  # the loop thread only removes from it: lookups are safe
        with self._lock:
            self._check_serving()
            mine: set[str] = set()  # ids of this batch
            for req, _ in batch:
                rid = req.request_id
                if rid and (rid in open_ or rid in mine):
                    raise ValueError(
                        f"request id {rid!r} is already in use by an unfinished "
                        "request; choose another or leave it out"
                    )
                mine.add(rid)
            for req, handle in batch:
                if not req.request_id:  # an engine-made id skips ids callers have in use
                    rid = f"req-{next(self._ids)}"
                    while rid in open_ or rid in mine:
                        rid = f"req-{next(self._ids)}"
                    mine.add(rid)
                    req.request_id = handle.request_id = rid
                p = req.params
                req.seed = p.seed if p.seed is not None else _stable_seed(self.config.seed,
                                                                          req.request_id)
                open_[req.request_id] = (req, handle)
                self._command("add", req)
        return [h for _, h in batch]

    def generate(self, prompts: PromptInput | list[PromptInput],
                 params: SamplingParams | dict | list[SamplingParams | dict] | None = None,
                 ) -> list[RequestOutput]:
        """Run prompts to the end. Every prompt and its params are validated before any is
        queued: one bad input refuses the whole call."""
        self._check_serving()
        plist, splist = inputs.generate_args(prompts, params)
        batch = [(req, RequestHandle(req.request_id))
                 for req in (self._prepare(p, sp, None) for p, sp in zip(plist, splist,
                                                                         strict=True))]
        handles = self._enqueue(batch)
        if self._thread is None:
            while not all(h.done for h in handles):
                self.step()
        return [h.result() for h in handles]

    def abort(self, request_id: str) -> None:
        """End an open request with "abort"; an unknown or finished id is ignored."""
        rid = inputs.check_request_id(request_id)
        with self._lock:
            req = self._sink.request(rid)
            if req is not None:
                self._command("abort", req)

    def _check_serving(self) -> None:
        if self.dead_reason is not None:
            raise RuntimeError(f"the engine stopped serving: {self.dead_reason}")
        if self._stop:
            raise RuntimeError("the engine is shut down")

    # ---------------------------------------------------------------------- the loop
    def _command(self, kind: str, arg: Any, done: Future | None = None) -> None:
        self._commands.put((kind, arg, done))
        self._wake.set()

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, arg, done = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self.loop.add(arg)
            elif kind == "abort":
                self.loop.abort(arg)
            elif kind == "call":  # run_on_loop: a caller's function at a step boundary
                assert done is not None
                start = time.perf_counter_ns()
                try:
                    done.set_result(arg())
                except Exception as e:
                    done.set_exception(e)
                self._mark_command(start, "run_on_loop")
            elif kind == "configure":
                assert done is not None
                start = time.perf_counter_ns()
                try:
                    self._reconfigure(*arg)
                except Exception as e:  # the caller is told; the engine serves on
                    log.exception("configure failed")
                    done.set_exception(RuntimeError(f"configure failed: {describe(e)}"))
                else:
                    done.set_result(None)
                self._mark_command(start, "live settings: " + ", ".join(
                    f"{k}={v}" for k, v in inspect.signature(self._reconfigure).bind(*arg)
                    .arguments.items() if v is not None))

    def _mark_command(self, start_ns: int, label: str) -> None:
        """A command ran on the loop thread from start_ns until now: a stall it causes is
        named for it."""
        if self.stall_watch is not None:
            self.stall_watch.add_mark(ENGINE_COMMAND, start_ns, time.perf_counter_ns(), label)

    def step(self) -> bool:
        """One step boundary: apply commands, then schedule/launch/read. For manual driving
        (Engine(..., start=False)); the loop thread calls it otherwise."""
        self._apply_commands()
        return self.loop.step()

    def _run(self) -> None:
        try:
            while not self._stop:
                try:
                    worked = self.step()
                except Exception as e:  # an engine bug: fail what was open, serve on
                    log.exception("engine step failed")
                    self.loop.recover(e)
                    worked = True
                if not worked:
                    self._wake.wait(0.05)
                    self._wake.clear()
        except BaseException as e:  # nothing may end this thread silently
            self._die(e)
        finally:
            self.instruments.close()  # the profiler is this thread's to stop

    def _die(self, error: BaseException) -> None:
        """The loop thread cannot go on: say why to every caller, now and later."""
        log.critical("engine loop thread died", exc_info=error)
        with self._lock:
            self.dead_reason = f"the engine loop thread died ({describe(error)})"
        while True:  # commands queued before the lock above will never be applied
            try:
                kind, _, done = self._commands.get_nowait()
            except queue.Empty:
                break
            if done is not None:
                done.set_exception(RuntimeError(self.dead_reason))
        self._sink.fail_open(self.dead_reason)

    def shutdown(self) -> None:
        if self._stop:
            return
        self._stop = True
        self._wake.set()
        try:
            if self._thread is not None:
                self._thread.join(timeout=30)
            if self.dead_reason is not None:
                self.streams.close()
                return
            self._apply_commands()
            self.loop.end_all("abort")
            self.loop.close()
            if self._thread is None:  # manual stepping: this thread ran the instruments
                self.instruments.close()
        finally:
            if self.tp is not None:  # the worker ranks end with this one
                self.tp.close()
            if self.stall_watch is not None:
                self.stall_watch.close()
            if self._settled:
                self._settled = False
                heap.release()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _max_model_len(config: EngineConfig, text_cfg: Any) -> int:
    model_max = getattr(text_cfg, "max_position_embeddings", None)
    if config.max_model_len is None:
        return min(int(model_max or 4096), 4096)
    if model_max and config.max_model_len > int(model_max):
        raise ValueError(
            f"max_model_len={config.max_model_len} is above the model's "
            f"max_position_embeddings={model_max}; give max_model_len <= {model_max}"
        )
    return config.max_model_len
