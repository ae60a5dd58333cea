"""The engine's live control: change async batching, slots, CUDA graphs and the sentinel at
the next step boundary, and read the settings and counters in force.

Owns the settings version (bumped by each configure() that changes a live setting: clients
compare-and-set on it) and the shape of settings() and stats(). A mixin of engine.Engine,
which holds the loop, its command queue and its lock; it never touches a step in flight.
Never imports UI code.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from engine.instruments.sentinel import check_sample_every


class LiveControl:
    """Engine's live-settings half (engine/engine.py builds what it uses: loop, config,
    scheduler, _lock, _command, _apply_commands, _check_serving, _thread)."""

    settings_version = 0

    def configure(self, async_batching: bool | None = None, num_slots: int | None = None,
                  cuda_graphs: bool | None = None,
                  sentinel_sample_every: int | None = None) -> dict[str, Any]:
        """Change live settings; they take effect at the next step boundary (the pipeline
        drains first). Returns the settings in force afterwards."""
        if async_batching is not None and not isinstance(async_batching, bool):
            raise ValueError(f"async_batching must be true or false, got {async_batching!r}")
        if num_slots is not None and (type(num_slots) is not int or num_slots not in (1, 2, 3)):
            raise ValueError(f"num_slots must be 1, 2 or 3, got {num_slots!r}")
        if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be true or false, got {cuda_graphs!r}")
        if cuda_graphs and self.loop.graphs is None:
            raise ValueError(f"cuda_graphs cannot be turned on: {self.loop.graphs_reason()}")
        if sentinel_sample_every is not None:
            check_sample_every(sentinel_sample_every)
            if sentinel_sample_every and self.loop.sentinel is None:
                raise ValueError("the sentinel cannot be turned on with tensor_parallel_size > 1")
        before = self._live_settings()
        self._run_command("configure", (async_batching, num_slots, cuda_graphs,
                                        sentinel_sample_every))
        if self._live_settings() != before:
            self.settings_version += 1
        return self.settings()

    def run_on_loop(self, fn: Any, timeout_s: float = 60.0) -> Any:
        """``fn()`` on the loop thread at the next step boundary (no launch of ours in
        progress on that thread); its result, or its exception raised here. For tools that
        must not act while the loop launches: a profiler session stopped from another thread
        while the loop thread was launching left that thread's kernel launches unrecorded
        in later sessions (bench/suites/truth_kick.py)."""
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
        sentinel = 0 if self.loop.sentinel is None else self.loop.sentinel.sample_every
        return (s.async_batching, s.num_slots, self.loop.graphs_active, sentinel)

    def settings(self) -> dict[str, Any]:
        s = self.loop.settings
        return {
            "async_batching": s.async_batching,
            "num_slots": s.num_slots,
            "cuda_graphs": self.loop.graphs_active,
            "cuda_graphs_available": self.loop.graphs is not None and not self.loop.graphs.failure,
            "cuda_graphs_reason": self.loop.graphs_reason(),
            "sentinel_sample_every": 0 if self.loop.sentinel is None
            else self.loop.sentinel.sample_every,
            "settings_version": self.settings_version,
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "model": self.config.model,
            "attention_backend": self.backend_name,
            "model_impl": self.model_impl,
            "fused_layer": self.fused_layer,
            "blas_library": self.blas_library,
            "tensor_parallel_size": self.config.tensor_parallel_size,
            "torch_compile": self.torch_compile,
            "max_num_seqs": self.config.max_num_seqs,
            "max_num_batched_tokens": self.config.max_num_batched_tokens,
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
            **({} if self.loop.sentinel is None else self.loop.sentinel.stats()),
            **self.loop.pipeline.kernels.stats(),
        }

