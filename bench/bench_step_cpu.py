"""The CPU's work per step, phase by phase, with the device work stubbed out.

Drives the real StepLoop (scheduler, assembly, pipeline bookkeeping, token delivery,
detokenization, stop checks, request events, step records on the bus) for pure decode steps,
with two stand-ins: streams that run their work inline in the calling thread (no worker
threads to wake, no device), and a model runner whose "compute" writes the next token of a
fixed text for each sampled row. What is left is the host's work per step, the work that
has to fit under the device's step time for async mode to keep the GPU busy.

Per batch size and tokenizer it runs variants, so each cost shows as a difference:

    ids      : detokenize off, telemetry off     (schedule, assemble, launch, append, stops)
    +telem   : telemetry on                      (+ spans, step record, request events, bus)
    +detok   : + detokenize, text deltas to the request handles
    +stop    : + two stop strings per request that never match (the search runs every token)

It prints, per variant, the median CPU time of one StepLoop.step() on the loop thread
(time.thread_time_ns: the figure to compare, as it hardly moves when other jobs load the
machine), its median and p90 wall time, and the median wall time of each CPU lane the loop
records (schedule, prepare, launch, wait, post; wait is ~0 with inline streams), launch less
the stand-in device work ("bookkeeping"), and the loop's time outside its lanes ("other").
`--gc` instead runs many requests to the end and reports the garbage collector's pauses on
the loop thread (gc.callbacks), with and without the loop's GC settings.

Usage: python bench/bench_step_cpu.py [--batch 1 16 64] [--steps 400] [--gc]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from engine.config import SamplingParams  # noqa: E402
from engine.core.batch import BufferLayout  # noqa: E402
from engine.core.block_allocator import BlockAllocator, blocks_needed  # noqa: E402
from engine.core.request import Request  # noqa: E402
from engine.core.scheduler import Scheduler  # noqa: E402
from engine.core.scratch import Scratch  # noqa: E402
from engine.handles import HandleSink, RequestHandle  # noqa: E402
from engine.step.loop import LiveSettings, StepLoop  # noqa: E402
from engine.step.streams import HostEvent  # noqa: E402
from telemetry.bus import TelemetryBus  # noqa: E402

TOKENIZERS = {
    "tiny": ROOT / "models" / "gapless-tiny-python",
    "smollm2-135m": ROOT / "models" / "SmolLM2-135M-Instruct",
}
DEVICE = "inline"  # or "cuda" (--device)
LANES = ("cpu.schedule", "cpu.prepare", "cpu.launch", "cpu.wait", "cpu.post")
DEVICE_WORK = ("h2d", "compute", "d2h")  # the stand-in device work, run inline in cpu.launch
VARIANTS = {  # name: (telemetry, detokenize, stop strings)
    "ids": (False, False, None),
    "+telem": (True, False, None),
    "+detok": (True, True, None),
    "+stop": (True, True, ["<never-1>", "\n\n\n\n\n\n"]),
}


# ------------------------------------------------------------------ stand-ins for the device
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


def make_streams():
    """Inline host streams, or with --device cuda the engine's real CUDA streams (then the
    launch, wait and span-reading costs are the CUDA ones; the stand-in compute is a gather)."""
    if DEVICE == "cuda":
        import torch

        from engine.step.streams import StreamSet

        return StreamSet(torch.device("cuda"))
    return InlineStreams()


# ----------------------------------------------------------------------------- one variant
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
        streams=make_streams(),  # type: ignore[arg-type]
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


def measure(tokenizer, batch: int, variant: str, steps: int) -> dict[str, float]:
    telemetry, detokenize, stop = VARIANTS[variant]
    loop, sink = build_loop(tokenizer, batch, telemetry, detokenize, stop, steps)
    while (
        any(r.num_computed < r.prompt_len for r in loop.scheduler.running) or loop.scheduler.waiting
    ):  # prefill everyone
        loop.step()
    for _ in range(8):  # and settle into decode
        loop.step()
    reader = loop.bus.reader(from_now=True) if loop.bus is not None else None
    walls, cpus = [], []
    for _ in range(steps):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        loop.step()
        walls.append(time.perf_counter_ns() - t0)
        cpus.append(time.thread_time_ns() - c0)
    lanes: dict[str, list[int]] = {lane: [] for lane in LANES + ("bookkeeping", "other")}
    if reader is not None:
        recs = reader.steps()
        for rec in recs:
            assert rec.decode_tokens == batch and rec.prefill_tokens == 0, rec
            d = {sp.lane: sp.end_ns - sp.start_ns for sp in rec.spans}
            for lane in LANES:
                lanes[lane].append(d[lane])
            # launch less the stand-in device work run inline: the pipeline's own work
            inline = sum(d[k] for k in DEVICE_WORK) if DEVICE == "inline" else 0
            lanes["bookkeeping"].append(d["cpu.launch"] - inline)
        # What no lane covers: the step record, reading op spans, publishing (the loop's
        # time outside its spans): step wall less the lanes of the record published in it.
        for wall, rec in zip(walls, recs, strict=False):
            d = {sp.lane: sp.end_ns - sp.start_ns for sp in rec.spans}
            lanes["other"].append(wall - sum(d[lane] for lane in LANES))
    assert all(len(r.output_token_ids) > steps for r in loop.scheduler.running)
    loop.end_all("abort")
    loop.close()
    out = {
        "cpu_us": statistics.median(cpus) / 1e3,
        "step_us": statistics.median(walls) / 1e3,
        "step_p90_us": float(np.percentile(walls, 90)) / 1e3,
    }
    for lane, xs in lanes.items():
        out[lane] = statistics.median(xs) / 1e3 if xs else float("nan")
    return out


# ------------------------------------------------------------------------------------- GC
def gc_run(
    tokenizer, requests: int, new_tokens: int, batch: int, freeze: bool, threshold0: int | None
) -> dict[str, float]:
    """Many requests, each run to its end, through the loop (telemetry on, detokenized);
    returns the loop thread's GC pauses. The caller has loaded a real model first, so the
    heap a full collection walks is an engine process's (torch, transformers, the model)."""
    # (generation, wall ns, loop-thread CPU ns): on a loaded VM the wall time of a pause
    # also counts time the thread was descheduled; the CPU time is the collection's own.
    pauses: list[tuple[int, int, int]] = []
    started: list[tuple[int, int]] = []

    def cb(phase: str, info: dict) -> None:
        if phase == "start":
            started.append((time.perf_counter_ns(), time.thread_time_ns()))
        elif started:
            w, c = started.pop()
            pauses.append(
                (info["generation"], time.perf_counter_ns() - w, time.thread_time_ns() - c)
            )

    loop, sink = build_loop(tokenizer, batch, True, True, None, new_tokens)
    loop.end_all("abort")
    eos = {tokenizer.eos_token_id}
    ids = text_ids(tokenizer, eos)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i in range(requests):
        prompt = [int(x) for x in ids[(i * 7) % 50 : (i * 7) % 50 + 128]]
        req = Request(f"g{i}", prompt, params, i, time.perf_counter_ns())
        sink.open[req.request_id] = (req, RequestHandle(req.request_id))
        loop.add(req)
    if freeze:  # what the engine does once its model is loaded
        from engine.step import heap

        heap.settle()
    if threshold0 is not None:
        gc.set_threshold(threshold0, *gc.get_threshold()[1:])
    tracked = len(gc.get_objects())
    gc.callbacks.append(cb)
    t0 = time.perf_counter()
    steps = 0
    try:
        while loop.step():
            steps += 1
    finally:
        gc.callbacks.remove(cb)
    wall = time.perf_counter() - t0
    loop.close()
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # (else extension modules report "leaks" at exit)
    by_gen = {g: [ns for gg, ns, _ in pauses if gg == g] for g in (0, 1, 2)}
    cpu_gen = {g: [ns for gg, _, ns in pauses if gg == g] for g in (0, 1, 2)}
    out: dict[str, float] = {"steps": steps, "wall_s": wall, "tracked": tracked, "frozen": frozen}
    for g, xs in by_gen.items():
        out[f"gen{g}_n"] = len(xs)
        out[f"gen{g}_max_ms"] = max(xs) / 1e6 if xs else 0.0
        out[f"gen{g}_total_ms"] = sum(xs) / 1e6
        out[f"gen{g}_cpu_max_ms"] = max(cpu_gen[g]) / 1e6 if cpu_gen[g] else 0.0
    return out


def summarize(path: Path) -> None:
    """The median over rounds of each cell of an A/B log (bench/ab_step_cpu.sh)."""
    cols = ["cpu", "wall", "p90", "schedule", "prepare", "launch", "wait", "post", "other"]
    cells: dict[tuple[str, str, str, str], list[list[float]]] = {}
    tree = ""
    for line in path.read_text().splitlines():
        if line.startswith("## round"):
            words = line.split()
            tree = "before" if words[4] in ("before", "base") else "after"
        elif line.startswith("| ") and not line.startswith("| tokenizer"):
            f = [c.strip() for c in line.strip("|").split("|")]
            if len(f) != 12:
                continue
            launch = f[8].split()[0]
            nums = [float(x) for x in (f[3], f[4], f[5], f[6], f[7], launch, f[9], f[10], f[11])]
            cells.setdefault((f[0], f[1], f[2], tree), []).append(nums)
    print(
        "| tokenizer | batch | variant | rounds | "
        + " | ".join(f"{c} before -> after (us)" for c in cols)
        + " |"
    )
    print("|---|---:|---|---:|" + "---:|" * len(cols))
    for (tok, batch, variant, tree), rows in cells.items():
        if tree != "before" or (tok, batch, variant, "after") not in cells:
            continue
        after = cells[(tok, batch, variant, "after")]
        med = lambda rs, i: statistics.median(r[i] for r in rs)  # noqa: E731
        parts = [f"{med(rows, i):.0f} -> {med(after, i):.0f}" for i in range(len(cols))]
        print(
            f"| {tok} | {batch} | {variant} | {min(len(rows), len(after))} | "
            + " | ".join(parts)
            + " |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 16, 64])
    ap.add_argument("--tokenizer", nargs="*", default=list(TOKENIZERS), choices=list(TOKENIZERS))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=2, help="runs per cell; the best is shown")
    ap.add_argument("--gc", action="store_true", help="measure GC pauses instead")
    ap.add_argument("--gc-requests", type=int, default=2000)
    ap.add_argument("--gc-new", type=int, default=256)
    ap.add_argument("--gc-batch", type=int, default=64)
    ap.add_argument("--gc-freeze", action="store_true", help="gc.collect() + gc.freeze() first")
    ap.add_argument("--gc-threshold0", type=int, default=None)
    ap.add_argument(
        "--device",
        choices=["inline", "cuda"],
        default="inline",
        help="inline: stand-in streams run in the loop thread (no device); cuda: "
        "the engine's CUDA streams with a gather as the device work",
    )
    ap.add_argument("--summarize", type=Path, help="print the before/after table of an A/B log")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and args.gc:
        ap.error("--gc runs on the inline streams; leave out --device cuda")
    if DEVICE == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda needs a CUDA GPU; this machine has none (use --device inline)")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  python {sys.version.split()[0]}  "
        f"gc thresholds {gc.get_threshold()}"
    )
    if args.gc:
        from transformers import AutoModelForCausalLM

        path = TOKENIZERS[args.tokenizer[0]]
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)  # noqa: F841 (held: the heap)
        r = gc_run(
            tok, args.gc_requests, args.gc_new, args.gc_batch, args.gc_freeze, args.gc_threshold0
        )
        print(
            f"model {path.name}; {args.gc_requests} requests x {args.gc_new} new tokens, "
            f"batch {args.gc_batch}; freeze={args.gc_freeze} threshold0={args.gc_threshold0}"
            f"; objects tracked at start {int(r['tracked'])}, frozen {int(r['frozen'])}"
        )
        print("collections: count / longest wall ms (longest CPU ms) / total wall ms")
        print("| steps | wall (s) | gen0 | gen1 | gen2 |")
        print("|---:|---:|---|---|---|")
        cells = [
            f"{int(r[f'gen{g}_n'])} / {r[f'gen{g}_max_ms']:.2f} ({r[f'gen{g}_cpu_max_ms']:.2f})"
            f" / {r[f'gen{g}_total_ms']:.1f}"
            for g in (0, 1, 2)
        ]
        print(f"| {int(r['steps'])} | {r['wall_s']:.2f} | " + " | ".join(cells) + " |")
        return
    print(
        "| tokenizer | batch | variant | step CPU time (us) | step wall median (us) | "
        "step wall p90 (us) | schedule | "
        "prepare | launch (bookkeeping) | wait | post | other |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.tokenizer:
        tok = AutoTokenizer.from_pretrained(TOKENIZERS[name])
        for batch in args.batch:
            for variant in args.variants:
                runs = [measure(tok, batch, variant, args.steps) for _ in range(args.repeats)]
                r = min(runs, key=lambda x: x["cpu_us"])
                lanes = (
                    f"{r['cpu.schedule']:.1f} | {r['cpu.prepare']:.1f} | "
                    f"{r['cpu.launch']:.1f} ({r['bookkeeping']:.1f}) | {r['cpu.wait']:.1f} | "
                    f"{r['cpu.post']:.1f} | {r['other']:.1f}"
                )
                print(
                    f"| {name} | {batch} | {variant} | {r['cpu_us']:.1f} | {r['step_us']:.1f} | "
                    f"{r['step_p90_us']:.1f} | {lanes} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
