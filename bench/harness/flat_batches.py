"""Hand-built flat batches for timing a bare forward: decode steps and prefill chunks on one
paged cache, eager or compiled, timed alone, in a CUDA graph, or over steps of random shape.

Used by `python -m bench compile`. Imports torch lazily (that suite sets the inductor cache
folder before torch is imported).
"""

from __future__ import annotations

import math
import random
import statistics
import time


def unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class StepBench:
    """Flat batches for the forward, built by hand on one paged cache: R + 1 requests with
    blocks of their own, a decode step of b tokens (requests 0..b-1 at position `context`) or
    a prefill of p tokens (request R, positions 0..p-1, so it never changes what a decode
    reads)."""

    def __init__(
        self, model, device, dtype, max_batch: int, context: int, prefill: int, block_size: int
    ) -> None:
        import torch

        from engine.attention.interface import resolve_backend
        from engine.model.hf_config import kv_cache_shape, text_config

        self.torch = torch
        self.model, self.device = model, device
        self.vocab = int(text_config(model.config).vocab_size)
        layers, kvh, hd = kv_cache_shape(model.config)
        self.block_size = block_size
        self.width = math.ceil((max(context + 1, prefill) + 1) / block_size)
        self.max_batch = max_batch
        num_blocks = (max_batch + 1) * self.width + 1  # the last row: the prefill's
        self.caches = [
            (
                torch.randn(num_blocks, block_size, kvh, hd, device=device).to(dtype),
                torch.randn(num_blocks, block_size, kvh, hd, device=device).to(dtype),
            )
            for _ in range(layers)
        ]
        self.block_tables = torch.arange(
            (max_batch + 1) * self.width, dtype=torch.int32, device=device
        ).view(max_batch + 1, self.width)
        self.context = context
        self.backend_name, self.backend = resolve_backend("auto", device)
        self.op_backend = self.backend  # compile_forward's, once compiled

    def inputs(self, name: str, n: int, samples: int | None = None) -> dict:
        """The same tensors for the same arguments (the ids are seeded by the shape)."""
        torch = self.torch
        if name == "decode":
            req = torch.arange(n, dtype=torch.int32)
            pos = torch.full((n,), self.context, dtype=torch.int32)
            keep = torch.arange(n) if samples is None else torch.arange(samples)
        else:
            req = torch.full((n,), self.max_batch, dtype=torch.int32)
            pos = torch.arange(n, dtype=torch.int32)
            keep = torch.tensor([n - 1]) if samples is None else torch.arange(samples) + n - samples
        blocks = self.block_tables.cpu()[req.long(), (pos // self.block_size).long()]
        slots = blocks.long() * self.block_size + (pos % self.block_size).long()
        gen = torch.Generator().manual_seed(2 * n + (name == "decode"))
        ids = torch.randint(1, self.vocab, (n,), generator=gen)
        d = self.device
        return {
            "ids": ids.to(d),
            "pos": pos.to(d),
            "req": req.to(d),
            "slots": slots.to(d),
            "keep": keep.to(d),
        }

    def run(self, x: dict, compiled: bool):
        """One forward; compiled: through the compiled module and the custom op, otherwise
        the module's own forward (nn.Module.compile leaves it eager) and the plain backend."""
        from engine.attention.interface import AttnContext

        ctx = AttnContext(
            kv_caches=self.caches,
            slot_mapping=x["slots"],
            block_tables=self.block_tables,
            token_req=x["req"],
            token_pos=x["pos"],
            backend=self.op_backend if compiled else self.backend,
        )
        call = self.model if compiled else self.model.forward
        out = call(
            input_ids=x["ids"][None],
            position_ids=x["pos"].long()[None],
            logits_to_keep=x["keep"],
            use_cache=False,
            gapless=ctx,
        )
        return out.logits[0]

    def forward(self, name: str, n: int, compiled: bool):
        return self.run(self.inputs(name, n), compiled)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def time_ms(self, name: str, n: int, iters: int) -> tuple[float, float]:
        """Median ms of one forward (eager, compiled), the two alternating step by step."""
        x = self.inputs(name, n)
        for compiled in (False, True, False, True):
            self.run(x, compiled)
        self.sync()
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(iters):
            for compiled in (False, True):
                t0 = time.perf_counter()
                self.run(x, compiled)
                self.sync()
                times[compiled].append(time.perf_counter() - t0)
        return (
            round(statistics.median(times[False]) * 1e3, 3),
            round(statistics.median(times[True]) * 1e3, 3),
        )

    def graph_time_ms(self, name: str, n: int, iters: int, compiled: bool) -> float:
        """The forward captured in a CUDA graph (as the engine captures compute()), replayed
        `iters` times between two events. Needs the Triton backend (the torch reference
        syncs with the host and cannot be captured)."""
        torch = self.torch
        x = self.inputs(name, n)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.run(x, compiled)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            self.run(x, compiled)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        del graph
        return round(start.elapsed_time(end) / iters, 3)

    def mixed_run(self, steps: int, batches: list[int], prefill: int) -> dict:
        """Steps of random shape, as a serving engine sees them: decode batches 1..max, and
        prefill chunks 1..prefill that sample 0 or 1 rows. Counts new graphs and the time of
        the steps that compiled."""
        rng = random.Random(0)
        before = unique_graphs()
        compile_s, shapes = 0.0, []
        for _ in range(steps):
            if prefill and rng.random() < 0.4:
                n = rng.randint(1, prefill)
                x = self.inputs("prefill", n, samples=rng.choice((0, 1)))
            else:
                n = rng.randint(1, max(batches))
                x = self.inputs("decode", n)
            graphs = unique_graphs()
            t0 = time.perf_counter()
            self.run(x, compiled=True)
            self.sync()
            if unique_graphs() > graphs:
                compile_s += time.perf_counter() - t0
                shapes.append([int(x["ids"].numel()), int(x["keep"].numel())])
        return {
            "steps": steps,
            "new_graphs": unique_graphs() - before,
            "compiled_at_tokens_samples": shapes,
            "compile_s": round(compile_s, 1),
        }
