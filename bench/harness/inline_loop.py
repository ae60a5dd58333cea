"""A StepLoop with the device stubbed out, for measuring the host's work per step.

Drives the real StepLoop (scheduler, assembly, pipeline bookkeeping, token delivery,
detokenization, stop checks, request events, step records on the bus) with two stand-ins:
streams that run their work inline in the calling thread (no worker threads to wake, no
device), and a model runner whose "compute" writes the next token of a fixed text for each
sampled row. With device "cuda" the engine's real CUDA streams are used instead (the stand-in
compute is then a gather). Used by `python -m bench step-cpu`; never times anything itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.config import SamplingParams
from engine.core.batch import BufferLayout
from engine.core.block_allocator import BlockAllocator, blocks_needed
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.scratch import Scratch
from engine.handles import HandleSink, RequestHandle
from engine.step.loop import LiveSettings, StepLoop
from engine.step.streams import HostEvent
from telemetry.bus import TelemetryBus

ROOT = Path(__file__).resolve().parents[2]
TOKENIZERS = {
    "tiny": ROOT / "models" / "gapless-tiny-python",
    "smollm2-135m": ROOT / "models" / "SmolLM2-135M-Instruct",
}


class InlineOp:
    __slots__ = ("lane", "start_ns", "end_ns")

    def __init__(self, lane: str) -> None:
        self.lane, self.start_ns, self.end_ns = lane, 0, 0

    def span_ns(self) -> tuple[int, int]:
        return self.start_ns, self.end_ns

    def launch_span_ns(self) -> None:
        return None


class InlineStream:
    """Runs work at once in the caller's thread: in-order streams with nothing to overlap."""

    def __init__(self, name: str) -> None:
        self.name = name

    def submit(self, fn: Callable[[], None]) -> None:
        fn()

    def timed(self, lane: str, fn: Callable[[], None], inner: object = None) -> InlineOp:
        op = InlineOp(lane)
        op.start_ns = time.perf_counter_ns()
        fn()
        op.end_ns = time.perf_counter_ns()
        return op

    def record(self, event: HostEvent) -> None:
        event.set()

    def wait(self, event: HostEvent) -> None:
        pass

    def order_after(self, event: HostEvent) -> None:
        pass

    def close(self) -> None:
        pass


class InlineStreams:
    is_cuda = False
    clock = None

    def __init__(self) -> None:
        import torch

        self.device = torch.device("cpu")
        self.h2d, self.compute, self.d2h = (InlineStream(n) for n in ("h2d", "compute", "d2h"))

    def event(self) -> HostEvent:
        return HostEvent()

    def reanchor(self) -> None:
        pass

    def close(self) -> None:
        pass


class TextRunner:
    """Samples the next token of a fixed text: row r at position p gets text[p % len]."""

    def __init__(self, text_ids: np.ndarray, kv_slot: int) -> None:
        self.text_ids = text_ids
        self.scratch = Scratch(kv_slot=kv_slot)

    def compute(self, v, num_tokens: int, num_samples: int, greedy_only: bool) -> None:
        s = num_samples
        if v.out.is_cuda:  # a few tiny kernels: the device work is ~nothing
            import torch

            if not hasattr(self, "text_dev"):
                self.text_dev = torch.as_tensor(self.text_ids, device=v.out.device)
            pos = v.sample_pos[:s].long() % len(self.text_ids)
            v.out[:s].copy_(self.text_dev[pos])
            return
        pos = v.sample_pos[:s].numpy()
        v.out[:s].numpy()[:] = self.text_ids[pos % len(self.text_ids)]


def make_streams(device: str = "inline"):
    """Inline host streams, or with device "cuda" the engine's real CUDA streams (then the
    launch, wait and span-reading costs are the CUDA ones; the stand-in compute is a gather)."""
    if device == "cuda":
        import torch

        from engine.step.streams import StreamSet

        return StreamSet(torch.device("cuda"))
    return InlineStreams()


def text_ids(tokenizer, eos: set[int]) -> np.ndarray:
    text = "\n".join(p.read_text() for p in sorted((ROOT / "engine" / "core").glob("*.py")))
    ids = [i for i in tokenizer.encode(text, add_special_tokens=False) if i not in eos]
    return np.asarray(ids, dtype=np.int64)


def build_loop(
    tokenizer,
    batch: int,
    telemetry: bool,
    detokenize: bool,
    stop: list[str] | None,
    steps: int,
    prompt_len: int = 128,
    block_size: int = 16,
    device: str = "inline",
) -> tuple[StepLoop, HandleSink]:
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    ids = text_ids(tokenizer, eos)
    max_len = prompt_len + steps + 64
    per_req = blocks_needed(max_len, block_size)
    num_blocks = batch * per_req + 1
    sched = Scheduler(BlockAllocator(num_blocks - 1), block_size, batch, 2048, max_len)
    sink = HandleSink()
    loop = StepLoop(
        runner=TextRunner(ids, kv_slot=(num_blocks - 1) * block_size),  # type: ignore[arg-type]
        scheduler=sched,
        streams=make_streams(device),  # type: ignore[arg-type]
        layout=BufferLayout(2048, batch, per_req),
        settings=LiveSettings(async_batching=True, num_slots=2, cuda_graphs=False),
        graphs=None,
        graphs_unavailable="bench: no device",
        bus=TelemetryBus() if telemetry else None,
        sink=sink,
        tokenizer=tokenizer,
        eos_ids=eos,
    )
    params = SamplingParams(
        max_tokens=steps + 32, temperature=0.0, ignore_eos=True, detokenize=detokenize, stop=stop
    )
    for i in range(batch):
        prompt = [int(x) for x in ids[(i * 7) % 50 : (i * 7) % 50 + prompt_len]]
        req = Request(f"r{i}", prompt, params, i, time.perf_counter_ns())
        sink.open[req.request_id] = (req, RequestHandle(req.request_id))
        loop.add(req)
    return loop, sink
