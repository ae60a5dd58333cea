"""A stand-in for engine.process.client.EngineClient, for page tests that need a failing engine.

It follows docs/engine-client-api.md closely enough for the pages: settings and configure
with the engine's validation, submit/stream/result, a telemetry bus fed with plausible step
records and request events, a load generator, a benchmark, and a kill switch. Tests use it
where the real engine cannot be made to fail on purpose (death, a restart that fails) and
for the fast page tests; the real client is tested in test_pages_engine.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.config import check_live_setting, check_token_budget
from engine.drivers.workload import BenchmarkProgress, BenchmarkResult, default_modes, mode_label
from engine.process.client import EngineDead
from telemetry.anatomy import Kernel, StepKernels, summary_dict
from telemetry.bus import TelemetryBus
from telemetry.kernel_family import family_of
from telemetry.kernels import KernelRecord, KernelSample, SampledStep, make_sample
from telemetry.records import LANES, RequestEvent, Span, StepRecord

REPLY = ["def", " add", "(a", ",", " b", "):", "\n", "    return", " a", " +", " b", "\n"]


class FakeEngineDead(EngineDead):
    """What the fake raises once killed: an engine.process.client.EngineDead, as the real one."""


@dataclass(slots=True)
class FakeOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    metrics: dict[str, float] = field(default_factory=dict)


def fake_steps(first_step: int, n: int, mode: str, t0_ns: int) -> list[StepRecord]:
    """``n`` steps of 1 ms each with every lane present, starting at ``t0_ns``."""
    out = []
    for k in range(n):
        t = t0_ns + k * 1_000_000
        spans = [
            Span(lane, t + i * 100_000, t + i * 100_000 + 80_000) for i, lane in enumerate(LANES)
        ]
        out.append(
            StepRecord(
                step=first_step + k,
                mode=mode,
                slot=k % 2,
                num_requests=2,  # type: ignore[arg-type]
                prefill_tokens=0,
                decode_tokens=2,
                spans=spans,
                running=2,
                kv_blocks_used=4,
                kv_blocks_total=64,
            )
        )
    return out


def fake_kernel_sample(rec: StepRecord) -> KernelSample:
    """One sampled step's kernels inside its compute span: a GEMM, attention, a norm."""
    (c,) = [s for s in rec.spans if s.lane == "compute"]
    third = c.duration_ns // 3
    names = ("nvjet_tst_128x64_gemm", "_paged_attention_kernel", "rms_norm_kernel")
    kernels = [KernelRecord(n, family_of(n), c.start_ns + i * third,
                            c.start_ns + i * third + third - 2_000)
               for i, n in enumerate(names)]
    sample = make_sample([SampledStep(rec.step, kernels)], None)
    assert sample is not None
    return sample


class FakeEngineClient:
    def __init__(
        self, *, graphs_available: bool = False, token_delay_s: float = 0.001, **_: Any
    ) -> None:
        self.token_delay_s = token_delay_s
        self.bus = TelemetryBus()
        self.graphs_available = graphs_available
        self._settings: dict[str, Any] = {
            "async_batching": True,
            "num_slots": 2,
            "cuda_graphs": False,
            "cuda_graphs_available": graphs_available,
            "cuda_graphs_reason": None if graphs_available else "no CUDA device",
            "device": "cuda" if graphs_available else "cpu",
            "model": "fake/model",
            "dtype": "float32",
            "model_impl": "gapless",
            "max_num_seqs": 8,
            "max_model_len": 256,
            "max_num_batched_tokens": 512,
            "max_num_batched_tokens_range": [8, 512],
        }
        self._settings.update(settings_version=0, engine_pid=1, sentinel_sample_every=0)
        self.configured_by: list[str | None] = []
        self._dead: str | None = None
        self.hung = False  # stopped (SIGSTOP): calls time out, status() says so
        self.pid = None  # never a real process id: ui.engine_link.kill_and_restart would kill it
        self.generation = 1
        self.call_timeout_s = 2.0
        self._load = False
        self._ids = itertools.count()
        self._step = 0
        self._lock = threading.Lock()
        self.restart_fails = False
        self.submitted: list[tuple[str, dict[str, Any] | None]] = []
        self.shut_down = False
        self.publish_steps(20)

    # -- life
    def alive(self) -> bool:
        return self._dead is None

    def death_reason(self) -> str | None:
        return self._dead

    def status(self) -> str:
        if self._dead is not None:
            return "dead"
        return "not_responding" if self.hung else "alive"

    def kill(self, reason: str = "engine process exited with code -9 (SIGKILL)") -> None:
        self._dead = reason

    def restart(self) -> None:
        if self.restart_fails:
            raise RuntimeError("could not start the engine: model folder missing")
        self._dead = None
        self.hung = False
        self.restarts = getattr(self, "restarts", 0) + 1
        self.generation += 1
        # A new engine process starts from the config file's settings.
        self._settings.update(async_batching=True, num_slots=2, cuda_graphs=False,
                              settings_version=0,
                              engine_pid=self._settings["engine_pid"] + 1)

    def shutdown(self) -> None:
        self.shut_down = True

    def _check(self) -> None:
        if self._dead is not None:
            raise FakeEngineDead(self._dead)
        if self.hung:
            raise TimeoutError("the engine did not answer settings within 2 s")

    # -- telemetry
    def publish_steps(self, n: int) -> None:
        with self._lock:
            mode = "async" if self._settings["async_batching"] else "sync"
            t0 = time.perf_counter_ns() - n * 1_000_000
            recs = fake_steps(self._step, n, mode, t0)
            if self._settings["device"] == "cuda":  # the engine's kernel sampler, recorded
                for a, b in zip(recs, recs[1:], strict=False):
                    if a.step % 5 == 0:
                        b.kernel_samples = [fake_kernel_sample(a)]
            for rec in recs:
                self.bus.publish_step(rec)
            self._step += n

    def telemetry(self) -> TelemetryBus:
        return self.bus

    def nvml(self) -> dict[str, Any] | None:
        return {"gpu_util_pct": 93.0} if self.graphs_available else None

    def nvml_reason(self) -> str | None:
        return None if self.graphs_available else "no GPU: NVML library not found"

    # -- control
    def settings(self) -> dict[str, Any]:
        self._check()
        return dict(self._settings)

    def stats(self) -> dict[str, int]:
        self._check()
        return {
            "running": 2,
            "waiting": 1,
            "kv_blocks_used": 16,
            "kv_blocks_total": 64,
            "steps": self._step,
            "generated_tokens": 2 * self._step,
            "preemptions": 0,
            **({"sentinel_checked": 12, "sentinel_mismatches": 0}
               if self._settings["sentinel_sample_every"] else {}),
        }

    def configure(
        self,
        async_batching: bool | None = None,
        num_slots: int | None = None,
        cuda_graphs: bool | None = None,
        *,
        expect_version: int | None = None,
        origin: str | None = None,
        sentinel_sample_every: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> dict[str, Any]:
        self._check()
        self.configured_by.append(origin)
        if expect_version is not None and expect_version != self._settings["settings_version"]:
            return {**self.settings(), "refused": "the settings changed before this change"}
        for key, value in (("async_batching", async_batching), ("num_slots", num_slots),
                           ("cuda_graphs", cuda_graphs),
                           ("sentinel_sample_every", sentinel_sample_every)):
            if value is not None:
                check_live_setting(key, value)  # the engine's own rule and message
        if cuda_graphs and not self.graphs_available:
            raise ValueError("cuda_graphs cannot be turned on: no CUDA device")
        if max_num_batched_tokens is not None:  # the engine's own range and message
            check_token_budget(max_num_batched_tokens,
                               tuple(self._settings["max_num_batched_tokens_range"]))
        for key, value in (
            ("async_batching", async_batching),
            ("num_slots", num_slots),
            ("cuda_graphs", cuda_graphs),
            ("sentinel_sample_every", sentinel_sample_every),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if value is not None and self._settings[key] != value:
                self._settings[key] = value
                self._settings["settings_version"] += 1
        return self.settings()

    # -- requests
    def submit(self, prompt: str | list[int], params: dict[str, Any] | None = None) -> str:
        self._check()
        if not prompt:
            raise ValueError("prompt is empty: give at least one token")
        if isinstance(prompt, str) and len(prompt) > 2000:
            raise ValueError(
                f"prompt is {len(prompt)} tokens long; max_model_len is 2000 (prompt + output)"
            )
        self.submitted.append((prompt if isinstance(prompt, str) else "<ids>", params))
        rid = f"req-{next(self._ids)}"
        t = time.perf_counter_ns()
        self.bus.publish_event(RequestEvent(rid, "queued", t, prompt_tokens=len(prompt)))
        self.bus.publish_event(RequestEvent(rid, "scheduled", t + 1000))
        return rid

    def stream(self, rid: str, timeout: float | None = None) -> Iterator[str]:
        for i, delta in enumerate(REPLY):
            self._check()
            time.sleep(self.token_delay_s)
            kind = "first_token" if i == 0 else "tokens"
            self.bus.publish_event(RequestEvent(rid, kind, time.perf_counter_ns(), 1))
            yield delta
        self.bus.publish_event(
            RequestEvent(rid, "finished", time.perf_counter_ns(), reason="length")
        )
        self.publish_steps(len(REPLY))

    def result(self, rid: str, timeout: float | None = None) -> FakeOutput:
        self._check()
        return FakeOutput(rid, [1, 2, 3], list(range(len(REPLY))), "".join(REPLY), "length")

    def abort(self, rid: str) -> None:
        pass

    # -- load generator
    def start_load(self, spec: Any) -> None:
        self._check()
        self.load_spec = spec
        self._load = True
        self._load_thread = threading.Thread(target=self._drive, daemon=True)
        self._load_thread.start()

    def _drive(self) -> None:
        # Steps keep coming while the load runs, in the mode of the moment.
        while self._load:
            self.publish_steps(5)
            time.sleep(0.02)

    def stop_load(self) -> None:
        self._load = False

    def load_running(self) -> bool:
        self._check()
        return self._load

    def load_stats(self) -> dict[str, Any]:
        self._check()
        return {"running": self._load, "submitted": 40, "finished": 30, "inflight": 8,
                "dropped": 2, "errors": 0, "stopped_reason": None,
                "spec": dataclasses.asdict(self.load_spec) if self._load else None}

    # -- benchmark
    def record_anatomy(self, n_steps: int = 8, timeout_s: float = 30.0) -> dict[str, Any]:
        """A canned recording: each step one GEMM, one attention, one norm kernel."""
        self._check()
        if not 1 <= n_steps <= 256:
            raise ValueError(f"n_steps must be an integer in 1..256, got {n_steps!r}")
        names = ("nvjet_tst_gemm", "_paged_attention_kernel", "rms_norm_kernel")
        steps = [StepKernels(100 + k, [Kernel(nm, family_of(nm), 1000.0 * k + 30 * i, 25.0)
                                       for i, nm in enumerate(names)]) for k in range(n_steps)]
        return summary_dict(steps, device="cuda", first_step=100)

    def run_benchmark(self, spec: Any) -> Iterator[BenchmarkProgress | BenchmarkResult]:
        self._check()
        labels = [mode_label(m) for m in spec.modes or default_modes(self.graphs_available)]
        for label in labels:
            rep = int(label.rpartition("#")[2]) if "#" in label else 1
            for done in range(0, spec.num_requests + 1, max(1, spec.num_requests // 4)):
                yield BenchmarkProgress(label, done, spec.num_requests)
            recs = fake_steps(0, 30, "async" if "async" in label else "sync", 0)
            yield BenchmarkResult(
                label,
                settings={},
                num_steps=len(recs),
                # async clearly faster than sync, a little jitter per repetition
                total_s=(1.5 if label.startswith("async") else 2.0) + 0.01 * rep,
                tokens_per_s=(680.0 if label.startswith("async") else 512.0) - rep,
                gpu_busy=0.8 if label.startswith("async") else 0.6,
                idle_total_s=0.2 if label.startswith("async") else 0.4,
                idle_gaps=20 if label.startswith("async") else 30,
                records=recs,
            )


class FakeClientWithoutHeartbeat(FakeEngineClient):
    """An engine client from before the heartbeat: no status(), hangs show as timeouts."""

    status = None  # type: ignore[assignment]


def reset_shared_state() -> None:
    """Server-wide dashboard state (one per Streamlit process) must not leak between tests."""
    import ui.engine_link
    import ui.widgets.bench_runner
    import ui.widgets.controls

    ui.widgets.bench_runner.RUNS.current = None
    ui.widgets.controls.LOAD_STOPS.started()
    ui.engine_link.RESTARTING.end()
    ui.engine_link.REMEMBERED.forget()
    ui.engine_link.HANG.answered()
    ui.engine_link.stop_watchdogs()


def control(at: Any, base: str) -> Any:
    """The settings widget ``base`` ("ctl.async", "ctl.slots", "ctl.graphs") an AppTest run
    drew: its key also names the engine's settings version (ui.widgets.controls.widget_key)."""
    kind = {"ctl.slots": "button_group", "ctl.budget": "number_input"}.get(base, "toggle")
    found = [w for w in getattr(at, kind) if str(w.key).startswith(base + ".")]
    assert len(found) == 1, [w.key for w in getattr(at, kind)]
    return found[0]


def serve_client(monkeypatch: Any, client: Any) -> Iterator[Any]:
    """Make ``client`` the dashboard's engine client for one test, with fresh shared state
    before and after (a fixture's body: ``yield from serve_client(...)``)."""
    import streamlit as st

    import ui.engine_link

    st.cache_resource.clear()
    reset_shared_state()
    monkeypatch.setattr(ui.engine_link, "make_client", lambda: client)
    yield client
    st.cache_resource.clear()
    reset_shared_state()
