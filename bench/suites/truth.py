"""Telemetry truth: measured kernel busy against torch.profiler in every mode, the
sampler's cost, the step waterfall against wall time, the byte floor and the separate-kernel
reference, and GPM checked.

For each shape (default: the 8B shape at batch 32, SmolLM2-135M's at 16; random bf16 weights,
256-token prompts, greedy, no EOS) and each mode (sync/async x graphs/eager), once the batch
decodes:

0. *bare*: ``--window-s`` with no profiler at all: the step period the tracers perturb;
1. *reference*: torch.profiler (CUDA activities only, our sampler off) over ``--window-s``:
   kernel busy = union of device work (host copies left out) / first kernel to last;
2. *ours*: the engine's kernel sampler (engine/instruments/kernel_sampler.py) at
   ``--sample-period``
   over the next ``--window-s``: kernel busy from the sampled steps' measured kernels
   (telemetry.kernels.kernel_busy). Target: within 1 pp of (1);
3. the waterfall of (2)'s window (telemetry.waterfall): byte floor at the peak copy
   bandwidth, kernels above it, in-step gaps, idle by cause, copies and sync; their sum
   against the window's wall time;
4. kernel time per step from (1) and (2) on the same steps, and busy against (0)'s period
   from each, the figures neither tracer perturbs; the dashboard's kernel busy of (0)
   against the reference's kernel time of (0)'s steps (bench/harness/truth_busy.py says why).
   (1) and (2) run as many steps as (0) did (each window is a fresh batch of the same
   prompts, so the same steps have the same contexts), at most 4 x ``--window-s``.

Then, on the first shape: a step anatomy (async + graphs) against the byte floor and the
separate-kernel reference per family;
GPM's DRAM bandwidth over a decode-only window against the anatomy's bytes / time; the
sampler's cost (engine at the default period vs off, alternated pairs); and a telemetry
recording of the four modes with kernel samples for the dashboard (recording.jsonl). On a GPU
the bandwidth curve is measured first (engine/instruments/floor_probe.py; curve.json).

    python -m bench truth                                  # one GPU
    python -m bench truth --device cpu --presets tiny:4 --dtype float32 --window-s 0.3 \\
        --pairs 1 --pair-new 8                             # CPU dry run (no kernels: n/a)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import report
from bench.harness.floor import COPY_BW, ByteFloor
from bench.harness.sampler_cost import add_cost_arguments, cost_pairs
from bench.harness.shapes import build_model
from bench.harness.truth_anatomy import anatomy_rows, contexts_of, step_reads
from bench.harness.truth_busy import (
    by_context,
    compute_spans,
    fair_busy,
    kernel_per_step,
    matched_kernel,
    period_us,
    reference_busy,
    run_until,
    sampled_by_step,
    sampled_kernel_per_step,
    step_differences,
    truth_busy,
)
from bench.harness.truth_engine import make_engine, params, wait_decoding
from bench.harness.truth_kick import kick, with_retries
from bench.harness.truth_report import markdown
from bench.harness.workload import default_device, random_prompts

DESCRIPTION = ("whether the dashboard's kernel busy agrees with torch.profiler's on the same "
               "steps, 4 modes (CUDA)")
MODES = ("sync-graphs", "async-graphs", "sync-eager", "async-eager")
STEADY_STEPS = 3  # decode steps run before a window starts (graph capture is behind them)
MIN_BARE_STEPS = 8  # a bare window runs at least these steps (up to 3 more windows' time)
HBM_SPEC_BW = 4.8e12  # bytes/s, the specified HBM3e bandwidth that GPM's DRAM_BW_UTIL is a share of
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--presets", default="llama-8b:32,smollm2-135m:16",
                        help="comma-separated PRESET:BATCH (default %(default)s)")
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--window-s", type=float, default=1.0,
                        help="seconds of decode per reference window and per sampled window")
    parser.add_argument("--sample-period", type=float, default=0.1,
                        help="sampler period during the comparison (the engine default is 10 s)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--trace-reader", default="json", choices=("json", "objects", "compare"),
                        help="how the sampler reads its traces: Kineto's JSON export, the "
                        "profiler's event objects, or both on the first sample (%(default)s)")
    add_cost_arguments(parser)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3,
                        help="reference/sampled window pairs per mode (the table's spread)")


# --------------------------------------------------------------------------- per mode
def truth_mode(eng: Any, model: torch.nn.Module, prompts: list[list[int]], mode: str,
               args: argparse.Namespace, curve: Any, nvml: Any) -> tuple[dict, list]:
    from telemetry.collect import StepCollector
    from telemetry.kernels import kernel_busy, sampled_step_periods
    from telemetry.waterfall import waterfall

    cuda = args.device == "cuda"
    sync_or_async, graphs = mode.split("-")
    eng.configure(async_batching=sync_or_async == "async", cuda_graphs=graphs == "graphs")
    sampler = eng.instruments.kernels
    sampler.set_period(0)
    batch = len(prompts)
    from engine.instruments.profiler_sessions import unsaved

    def fresh_batch() -> list[Any]:
        """The batch from its prompts again: every window decodes the same contexts (a
        step's attention time grows with its context), after any sample closed and was
        written (no profiler session while a trace of ours is unwritten: profiler_sessions)."""
        hs = [eng.submit(p, params(eng.config.max_model_len - args.prompt - 33))
              for p in prompts]
        wait_decoding(eng, batch)
        # ... and a few decode steps more: the first graph-mode decode steps after a mode
        # switch capture the batch's graphs, which can outlast a whole window (a large model's
        # first mode would then run no step in its bare window, and its row read n/a).
        s = eng.loop.step_no
        run_until(0, lambda: eng.loop.step_no - s >= STEADY_STEPS, 180)
        deadline = time.monotonic() + 5
        while (sampler.open or unsaved()) and time.monotonic() < deadline:
            time.sleep(0.005)
        if sampler.open or unsaved():
            raise RuntimeError("truth: a kernel sample stayed open or unwritten for 5 s; "
                               "the next window would run two profiler sessions at once")
        return hs

    def done(hs: list[Any]) -> None:
        for h in hs:
            eng.abort(h.request_id)
        for h in hs:
            h.result(timeout=120)

    with StepCollector(eng.bus) as col:
        hs = fresh_batch()  # bare: no profiler at all (the period the tracers perturb)
        s_bare = eng.loop.step_no
        bare_first = s_bare - STEADY_STEPS - 2  # about its batch's first decode step
        tb0 = time.perf_counter_ns()
        time.sleep(args.window_s)
        run_until(0, lambda: eng.loop.step_no - s_bare >= MIN_BARE_STEPS, 3 * args.window_s)
        tb1 = time.perf_counter_ns()
        n_bare = eng.loop.step_no - s_bare
        # A discarded profiler window, on this batch's tail: the first session after a mode
        # switch pays CUPTI's start-up and reads far too little busy. Not on the reference's
        # batch: it would move the reference's steps later, to longer contexts than the
        # sampler's.
        on_loop = eng.run_on_loop
        reference_busy(0.1, cuda, on_loop=on_loop)
        done(hs)

        def reached(s0: int) -> Any:
            """The reference and sampled windows run the bare window's steps (the same
            contexts: a step's kernel time grows with its context), however slow."""
            return lambda: eng.loop.step_no - s0 >= n_bare

        def ref_window() -> tuple[dict[str, Any], list, int, int]:
            hs = fresh_batch()
            a = time.perf_counter_ns()
            r, iv = reference_busy(args.window_s, cuda, reached(eng.loop.step_no),
                                   4 * args.window_s, on_loop)
            b = time.perf_counter_ns()
            done(hs)
            return r, iv, a, b

        # Tried again after a CUPTI kick if it lost every kernel record (truth_kick says why).
        ref, ref_iv, tr0, tr1 = with_retries(
            ref_window, cuda, kicker=lambda: kick(eng.loop.pipeline.streams.compute.stream))
        hs = fresh_batch()
        first_decode = eng.loop.step_no
        sampler.set_period(args.sample_period)
        sampler.next_at = 0.0
        t0 = time.perf_counter_ns()
        run_until(args.window_s, reached(first_decode), 4 * args.window_s)
        sampler.set_period(0)
        t1 = time.perf_counter_ns()
        deadline = time.monotonic() + 5
        while sampler.open and time.monotonic() < deadline:  # its last steps, still decoding
            time.sleep(0.005)
        # The last samples' conversions, each carried out on a later step's record: the batch
        # decodes on until all are out. (Aborted at once, the last one or two, at the
        # window's highest contexts, would never be published, and the dashboard would give
        # the last steps the kernel time of an earlier, shorter context.)
        deadline = time.monotonic() + 5
        while (sampler._converted < sampler._submitted or sampler.ready) \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        s_out = eng.loop.step_no
        run_until(0, lambda: eng.loop.step_no - s_out >= 2, 5)
        t2 = time.perf_counter_ns()
        done(hs)
    records = [r for r in col.records if r.num_tokens]
    samples = [s for r in col.records for s in r.kernel_samples]
    window = [r for r in records if any(s.lane == "compute" and t0 <= s.start_ns <= t1
                                        for s in r.spans)]
    out: dict[str, Any] = {"reference": ref, "samples": len(samples),
                           "sampled_steps": sum(len(s.steps) for s in samples),
                           "ours_busy": kernel_busy(samples), "steps": len(window),
                           "sampler_failures": sampler.failures,
                           "sampler_error": sampler.last_error,
                           "sample_cost_ms": [s.cost_ns / 1e6 for s in samples][:8],
                           "convert_ms": [round(x * 1e3, 2) for x in sampler.convert_s][-8:],
                           "bracket_idle_ms": [round(s.bracket_idle_ns / 1e6, 3)
                                               for s in samples][:8],
                           "ours_busy_raw": (sum(s.kernel_ns for s in samples) / sum(
                               s.window[1] - s.window[0] for s in samples)) if samples
                           else None,
                           "skipped_steps": [s.skipped_steps for s in samples][:8],
                           "lost_launches": [s.lost_launches for s in samples][:8],
                           "lost_samples": sampler.lost_samples,
                           "sampler_warmup": sampler.warmup,
                           **sampled_step_periods([r for r in records if any(
                               s.lane == "compute" and t0 <= s.start_ns <= t2
                               for s in r.spans)], samples)}
    if ref.get("busy") is not None and out["ours_busy"] is not None:
        out["diff_pp"] = 100 * (out["ours_busy"] - ref["busy"])
    bare, in_ref = compute_spans(records, tb0, tb1), compute_spans(records, tr0, tr1)
    kref = kernel_per_step(in_ref, ref_iv)
    # The reference window's first and last steps can be cut by the session's start and stop
    # (a cut step keeps a sliver of its kernels, and the truth it gives the bare step of the
    # same context reads the dashboard too high): not used.
    whole = dict(sorted(kref["by_step"].items())[1:-1])
    ref_ctx = by_context(records, whole)
    matched = matched_kernel(ref_ctx, by_context(records, sampled_by_step(samples)))
    out["fair"] = {"period_bare_us": period_us(bare), "period_ref_us": period_us(in_ref),
                   "period_sampled_us": out.get("period_us_sampled"), **matched,
                   "kernel_ref_all_us": kref["median_us"],
                   "kernel_ours_all_us": sampled_kernel_per_step(samples),
                   "ref_steps_joined": kref["steps"],
                   "ref_kernel_share_joined": kref["joined"], "bare_steps": n_bare}
    out["fair"].update(fair_busy(out["fair"]["period_bare_us"], matched["kernel_ref_us"],
                                 matched["kernel_ours_us"]))
    if bare and samples:  # the Live page between samples: kernel time per step of sampled
        # steps (by key and context, as live), given to the unsampled steps of the bare window
        wb = waterfall(records, tb0, tb1, samples)
        dash = (wb.kernel_ns / wb.window_ns if wb.kernel_ns is not None and wb.window_ns
                else None)
        truth_bare = truth_busy(records, ref_ctx, tb0, tb1)
        out["bare_steps_compared"] = step_differences(records, ref_ctx, samples, tb0, tb1)
        out["fair"].update(dashboard_bare=dash, truth_bare=truth_bare,
                           dashboard_vs_truth_pp=100 * (dash - truth_bare) if dash is not None
                           and truth_bare is not None else None)
    if window:
        comp = [s for r in window for s in r.spans if s.lane == "compute"]
        lo, hi = min(s.start_ns for s in comp), max(s.end_ns for s in comp)
        floor = ByteFloor.of(model) if model is not None else None

        def floor_ns(rec: Any) -> float:
            """At the measured peak copy rate, as the engine's records carry it (StepRecord.
            floor_ns): the separate-kernel reference is above a measured 8B step (its small
            reads are single cold-L2 kernels), so as the waterfall's floor it would take all
            kernel time."""
            reads = step_reads(model, floor, contexts_of(rec, args.prompt, first_decode))
            bw = curve.peak_copy_bw if curve is not None and curve.peak_copy_bw else COPY_BW
            return sum(reads) / bw * 1e9

        wf = waterfall(window, lo, hi, samples, floor_ns if cuda and floor else None)
        out["waterfall"] = {"wall_s": wf.window_ns / 1e9, "sum_s": wf.total_ns / 1e9,
                            "parts_s": {k: (v / 1e9 if v is not None else None)
                                        for k, v in wf.parts_ns.items()},
                            "sum_over_wall": wf.total_ns / wf.window_ns if wf.window_ns else None,
                            "kernel_busy": wf.kernel_ns / wf.window_ns if wf.kernel_ns
                            is not None and wf.window_ns else None}
        if nvml is not None and floor is not None:
            def gpm_check(steps: list[Any], a: int, b: int, first: int) -> dict[str, Any]:
                """GPM's mean DRAM bandwidth over [a, b] against the bytes the steps in it
                read (weights + KV at their contexts) over the same time, % of 4.8 TB/s."""
                gpm = [x.dram_bw_util_pct for x in nvml.history() if a <= x.t_ns <= b
                       and x.dram_bw_util_pct is not None]
                read = sum(sum(step_reads(model, floor, contexts_of(r, args.prompt, first)))
                           for r in steps)
                bps = read / ((b - a) / 1e9) if b > a else None
                return {"readings": len(gpm), "dram_bw_util_pct": statistics.fmean(gpm)
                        if gpm else None, "anatomy_bytes_per_s": bps,
                        "anatomy_pct_of_4p8": 100 * bps / HBM_SPEC_BW if bps else None}

            out["gpm"] = gpm_check(window, lo, hi, first_decode)  # the sampled window
            # The bare window: decode only, no profiler (what the dashboard's gauge reads).
            bare_steps = [r for r in records if any(s.lane == "compute" and tb0 <= s.start_ns
                                                    <= tb1 for s in r.spans)]
            out["gpm_bare"] = gpm_check(bare_steps, tb0, tb1, bare_first)
    return out, col.records


# ---------------------------------------------------------------------------- the run
def run(args: argparse.Namespace, out: Path) -> dict:
    from engine.instruments import kernel_sampler
    from telemetry.export import write_jsonl
    from telemetry.floor import load_curve

    kernel_sampler.set_trace_reader(args.trace_reader)
    cuda = args.device == "cuda"
    dtype = getattr(torch, args.dtype)
    # Kineto registers its client on the thread that imported torch: start it here once, so
    # later sessions (the sampler's, on the engine's loop thread) find it initialised.
    with torch.profiler.profile():
        pass
    summary: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu",
                               "torch": torch.__version__, "shapes": {}}
    curve = None
    if cuda:
        from engine.instruments.floor_probe import measure_curve

        t = time.perf_counter()
        curve = measure_curve()
        report.write_json(out / "curve.json", curve.to_dict())
        summary["curve"] = {**curve.to_dict(), "seconds": time.perf_counter() - t}
        log(f"curve ({time.perf_counter() - t:.1f} s): " + ", ".join(
            f"{b >> 20} MB {bw / 1e12:.2f}" for b, bw in curve.points) + " TB/s; copy "
            f"{curve.peak_copy_bw / 1e12:.2f} TB/s")
    else:
        curve = load_curve()
    nvml = None
    if cuda:
        from telemetry.nvml import NvmlSampler

        nvml = NvmlSampler(interval_s=0.1).start()
        summary["gpm_reason"] = nvml.gpm_reason
    for n, item in enumerate(args.presets.split(",")):
        preset, batch_s = item.split(":")
        batch = int(batch_s)
        model = build_model(preset, torch.device(args.device), dtype)
        prompts = random_prompts(batch, args.prompt, model.config.vocab_size)
        eng = make_engine(model, args, batch, 2048 if cuda else 64, name=preset)
        eng.generate(random_prompts(4, 16, model.config.vocab_size, seed=1), params(8))
        shape: dict[str, Any] = {"batch": batch, "modes": {}}
        recording = []
        for mode in args.modes.split(","):
            if mode.endswith("graphs") and not eng.settings()["cuda_graphs_available"]:
                log(f"{preset} {mode}: skipped ({eng.settings()['cuda_graphs_reason']})")
                continue
            res, recs = truth_mode(eng, model, prompts, mode, args, curve, nvml)
            reps = [res] + [truth_mode(eng, model, prompts, mode, args, curve, nvml)[0]
                            for _ in range(getattr(args, "repeats", 1) - 1)]
            res["repeats"] = [{"reference": r["reference"].get("busy"), "ours": r["ours_busy"],
                               "diff_pp": r.get("diff_pp"),
                               "attempts": r["reference"].get("attempts"), **r["fair"]}
                              for r in reps]
            shape["modes"][mode] = res
            recording += recs
            log(f"{preset} {mode}: {json.dumps(res, default=str)}")
        if n == 0:
            shape["anatomy"] = anatomy_rows(eng, model, prompts, args, curve, out)
            log(f"anatomy: {json.dumps(shape['anatomy'], default=str)}")
            path = out / f"recording-{preset}.jsonl"
            with open(path, "w") as f:
                f.write(json.dumps({"type": "meta", "machine": summary["device"],
                                    "date": time.strftime("%Y-%m-%d"),
                                    "commit": report.short_commit(), "model": preset,
                                    "workload": f"{batch} x {args.prompt} prompt, decode",
                                    "modes": args.modes}) + "\n")
            write_jsonl(path.with_suffix(".tmp"), recording)
            with open(path, "a") as f:
                f.write(path.with_suffix(".tmp").read_text())
            path.with_suffix(".tmp").unlink()
        eng.shutdown()
        if n == 0 and args.pairs > 0:  # --pairs 0: no cost pairs (watch-cost's sampler part)
            shape["sampler_cost"] = cost_pairs(model, prompts, args)
            log(f"cost: {json.dumps(shape['sampler_cost'])}")
        summary["shapes"][preset] = shape
        del model, eng
        if cuda:
            torch.cuda.empty_cache()
    if nvml is not None:
        nvml.close()
    summary["trace_read_from_objects"] = kernel_sampler.READ_OBJECTS
    summary["total_s"] = time.perf_counter() - T0
    report.write_json(out / "truth.json", summary)
    text = markdown(summary)
    (out / "truth.md").write_text(text)
    print(text, flush=True)
    return summary
