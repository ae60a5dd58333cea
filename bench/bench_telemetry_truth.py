"""Telemetry that cannot flatter (issue 12), checked on one GPU run against torch.profiler.

On the H200 (~3-4 min; writes logs, JSON, traces and tables to $OUT):

    python bench/bench_telemetry_truth.py

CPU smoke run (no kernels: profiler figures read n/a):

    python bench/bench_telemetry_truth.py --preset tiny --device cpu --new 24 --profile-new 12 \
        --pairs 1

Workload: a Llama-3.1-8B-shaped model with random bf16 weights, 32 requests x 256 prompt
tokens, greedy, no EOS. For each mode (sync/async x graphs/eager):

1. *calibration*: a 16-step anatomy recording (engine.step.anatomy) in decode gives each
   step's in-step kernel gaps (first kernel to last, minus time inside kernels);
2. *the same run, two ways*: ``--profile-new`` tokens run under torch.profiler while our
   telemetry records its steps. From the profiler: kernel busy (union of kernels / first
   kernel to last). From ours: step busy (union of compute spans), the old figure (compute
   plus compute.launch: what the stream events said before in-graph timing), and kernel
   busy estimated as step busy minus the calibrated gaps. Target: ours within 1 pp;
3. *unprofiled*: ``--new`` tokens for wall time, step busy and idle by cause; for sync
   modes the predicted async time (telemetry.predict) beside the measured async time.

Then a step anatomy of async+graphs decode (Kineto trace, a compact per-family trace, a
family table with the byte floor), GPM readings sampled during the runs, and telemetry
on vs off: two engines on the same weights, alternated ``--pairs`` times (< 1% apart).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_shapes import build_model, weight_bytes  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.step.anatomy import record_anatomy  # noqa: E402
from telemetry.anatomy import (  # noqa: E402
    anatomy_chrome_trace,
    family_table,
    floor_figures,
    gap_calibration,
    kernel_busy_of_window,
    step_key,
    union_us,
)
from telemetry.collect import StepCollector  # noqa: E402
from telemetry.gaps import CAUSE_LABELS, idle_by_cause  # noqa: E402
from telemetry.metrics import busy_intervals, spans_of  # noqa: E402
from telemetry.nvml import NvmlSampler  # noqa: E402
from telemetry.predict import predict_async  # noqa: E402
from telemetry.records import Span  # noqa: E402

COPY_BW = 4.22e12  # bytes/s, device-to-device copy on the lent H200 (DESIGN.md section 6)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


def make_engine(model: torch.nn.Module, args: argparse.Namespace, telemetry: bool) -> Engine:
    cuda = args.device == "cuda"
    blocks_per_req = -(-(args.prompt + max(args.new, args.calib_new) + 32) // 16)
    cfg = EngineConfig(
        model=f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=args.requests, max_num_batched_tokens=args.budget,
        max_model_len=args.prompt + max(args.new, args.calib_new) + 32, block_size=16,
        num_blocks=args.requests * blocks_per_req + 16, async_batching=True, num_slots=2,
        cuda_graphs=cuda, graph_buckets=[8, 16, args.requests] if cuda else None,
        telemetry=telemetry,
    )
    return Engine(cfg, model=model, tokenizer=None)


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)


def wait_for_decode(eng: Engine, start_steps: int, prompts: int, prompt_len: int,
                    budget: int) -> None:
    """Until the prefill steps of a just-submitted batch have run."""
    prefill_steps = -(-prompts * prompt_len // budget) + 2
    deadline = time.monotonic() + 120
    while eng.stats()["steps"] < start_steps + prefill_steps:
        if time.monotonic() > deadline:
            raise RuntimeError("prefill did not finish within 120 s")
        time.sleep(0.005)


def calibrate(eng: Engine, prompts: list[list[int]], args: argparse.Namespace,
              n_steps: int = 16):
    """An anatomy recording of ``n_steps`` decode steps, and its gap calibration."""
    with StepCollector(eng.bus) as col:
        start = eng.stats()["steps"]
        handles = [eng.submit(p, params(args.calib_new)) for p in prompts]
        wait_for_decode(eng, start, len(prompts), args.prompt, args.budget)
        rec = record_anatomy(eng, n_steps, timeout_s=120, trace_dir=str(args.out))
        for h in handles:
            h.result(timeout=300)
    key_of = {r.step: step_key(r.graph_bucket, r.num_tokens) for r in col.records}
    return rec, gap_calibration(rec.steps, key_of)


def profiler_kernels(prof: Any, path: Path) -> list[tuple[float, float]]:
    """Kernel intervals (us) of a finished torch.profiler run: the trace's ``cat: kernel``
    events (memcpy/memset and annotations left out), as bench_async.py --profile reads them."""
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        trace = json.load(f)["traceEvents"]
    path.unlink()
    return [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in trace
            if e.get("cat") == "kernel" and e.get("ph") == "X"]


def ours(records: list, cal=None) -> dict[str, Any]:
    """Our figures over our own window: first compute start to last compute end."""
    spans = spans_of(records)
    comp = [s for s in spans if s.lane == "compute"]
    if not comp:
        return {}
    lo, hi = min(s.start_ns for s in comp), max(s.end_ns for s in comp)
    starts, ends = busy_intervals(spans, lo, hi, "compute")
    busy_ns = int((ends - starts).sum())
    # What the stream events alone said: launch latency counted as busy.
    old = [s for s in spans if s.lane in ("compute", "compute.launch")]
    old_lo = min(s.start_ns for s in old)
    os_, oe = busy_intervals([Span("compute", s.start_ns, s.end_ns) for s in old],
                             old_lo, hi, "compute")
    out = {"window_s": (hi - lo) / 1e9, "step_busy": busy_ns / (hi - lo),
           "stream_event_busy": float((oe - os_).sum()) / (hi - old_lo),
           "steps": len(records)}
    if cal is not None:  # the same estimate the Live page shows after a recording
        out["kernel_busy_est"] = kernel_busy_of_window(records, lo, hi, cal)
    idle = idle_by_cause(records, lo, hi)
    out["idle_by_cause_s"] = {c: ns / 1e9 for c, ns in idle.by_cause.items() if ns}
    return out


def measured_run(eng: Engine, prompts: list[list[int]], n: int, cal, profile: bool,
                 out_dir: Path = Path("/tmp")) -> dict[str, Any]:
    prof = None
    with StepCollector(eng.bus) as col:
        t0 = time.perf_counter()
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as tprofile

            acts = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(ProfilerActivity.CUDA)
            with tprofile(activities=acts) as prof:
                outs = eng.generate(prompts, params(n))
        else:
            outs = eng.generate(prompts, params(n))
        wall = time.perf_counter() - t0
    assert all(len(o.token_ids) == n for o in outs) and col.dropped_steps == 0
    res = {"wall_s": wall, "tok_s": len(prompts) * n / wall, **ours(col.records, cal)}
    res["records"] = col.records
    if prof is not None:
        kernels = profiler_kernels(prof, out_dir / "profile.json")
        if kernels:
            lo, hi = min(a for a, _ in kernels), max(b for _, b in kernels)
            res["profiler_kernel_busy"] = union_us(kernels) / (hi - lo)
            res["profiler_kernels"] = len(kernels)
            res["profiler_window_s"] = (hi - lo) / 1e6
    return res


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=128, help="tokens per unprofiled run")
    ap.add_argument("--profile-new", type=int, default=64, help="tokens per profiled run")
    ap.add_argument("--profile-new-eager", type=int, default=24,
                    help="tokens per profiled eager run (thousands of CPU ops a step)")
    ap.add_argument("--calib-new", type=int, default=40, help="tokens per calibration run")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--pairs", type=int, default=3, help="telemetry on/off pairs")
    ap.add_argument("--modes", default="sync-graphs,async-graphs,sync-eager,async-eager")
    args = ap.parse_args()
    args.out = Path(os.environ.get("OUT", "artifacts"))
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    # Kineto registers its client on the thread that imported torch: start it here once, so
    # later recordings (some started on the engine's loop thread) find it initialised.
    with torch.profiler.profile():
        pass
    nvml = NvmlSampler(interval_s=0.2).start()
    log(f"NVML: {nvml.reason}; GPM: {nvml.gpm_reason}")
    model = build_model(args.preset, device, dtype)
    cfg = model.config
    vocab = cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (args.prompt,), generator=g).tolist()
               for _ in range(args.requests)]
    eng = make_engine(model, args, telemetry=True)
    log(f"engine ready: {eng.settings()}")
    eng.generate(prompts[:4], params(8))  # warm-up
    results: dict[str, Any] = {}
    for mode in args.modes.split(","):
        sync_or_async, graphs = mode.split("-")
        if graphs == "graphs" and not eng.settings()["cuda_graphs_available"]:
            log(f"skip {mode}: {eng.settings()['cuda_graphs_reason']}")
            continue
        eng.configure(async_batching=sync_or_async == "async", cuda_graphs=graphs == "graphs")
        rec, cal = calibrate(eng, prompts, args)
        os.unlink(rec.trace_path)
        n_prof = args.profile_new if graphs == "graphs" else args.profile_new_eager
        prof = measured_run(eng, prompts, n_prof, cal, profile=True, out_dir=args.out)
        plain = measured_run(eng, prompts, args.new, cal, profile=False)
        r = {"calibration": {"steps": cal.steps, "gap_fraction": cal.gap_fraction,
                             "gap_us": {str(k): v / 1000 for k, v in cal.gap_ns.items()}},
             "profiled": {k: v for k, v in prof.items() if k != "records"},
             "plain": {k: v for k, v in plain.items() if k != "records"}}
        if sync_or_async == "sync":
            p = predict_async(plain["records"])
            r["predicted_async_s"] = p.predicted_async_s
            r["cpu_on_critical_path_s"] = p.cpu_s
        results[mode] = r
        log(f"{mode}: {json.dumps(r)}")
    for graphs in ("graphs", "eager"):  # predicted (from sync) beside measured async
        s, a = results.get(f"sync-{graphs}"), results.get(f"async-{graphs}")
        if s and a:
            s["measured_async_s"] = a["plain"]["wall_s"]

    # -- step anatomy of async+graphs decode (or async eager without graphs) ---------------
    graphs_ok = eng.settings()["cuda_graphs_available"]
    eng.configure(async_batching=True, cuda_graphs=graphs_ok)
    with StepCollector(eng.bus):
        start = eng.stats()["steps"]
        handles = [eng.submit(p, params(args.calib_new)) for p in prompts]
        wait_for_decode(eng, start, len(prompts), args.prompt, args.budget)
        gen_before = eng.stats()["generated_tokens"]
        anat = record_anatomy(eng, 8, timeout_s=120, trace_dir=str(args.out))
        for h in handles:
            h.result(timeout=300)
    shutil.move(anat.trace_path, args.out / "anatomy_kineto_trace.json")
    (args.out / "anatomy_steps_trace.json").write_text(
        json.dumps(anatomy_chrome_trace(anat.steps)))
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * torch.tensor([], dtype=dtype).element_size()
    context = args.prompt + gen_before // args.requests  # mean context at the recording
    floor_bytes = weight_bytes(model) + args.requests * context * kv_per_token
    decode = [s for s in anat.steps if s.kernels]
    table = family_table(decode)
    mid = decode[len(decode) // 2] if decode else None
    floor = floor_figures(mid, floor_bytes, COPY_BW) if mid else None
    lines = [f"# Step anatomy: {args.preset}, batch {args.requests}, async"
             f"{'+graphs' if graphs_ok else ''}, {len(decode)} decode steps, "
             f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}", "",
             "| family | kernels/step | time/step (us) | share |", "|---|---:|---:|---:|"]
    lines += [f"| {r.family} | {r.count:.0f} | {r.time_us:.1f} | {100 * r.share:.1f}% |"
              for r in table]
    if mid is not None and floor is not None:
        lines += ["", f"step {mid.step}: {len(mid.kernels)} kernels, first kernel to last "
                  f"{mid.span_us:.1f} us, inside kernels {mid.kernel_us:.1f} us, gaps "
                  f"{mid.gap_us:.1f} us; byte floor {floor_bytes / 1e9:.2f} GB (weights + KV "
                  f"at context ~{context}) = {floor.floor_us:.1f} us at {COPY_BW / 1e12:.2f} "
                  f"TB/s; achieved {floor.achieved_bw / 1e12:.2f} TB/s, "
                  f"{floor.times_floor:.2f}x the floor"]
    (args.out / "anatomy_table.md").write_text("\n".join(lines) + "\n")
    html_rows = "".join(f"<tr><td>{r.family}</td><td>{r.count:.0f}</td><td>{r.time_us:.1f}"
                        f"</td><td>{100 * r.share:.1f}%</td></tr>" for r in table)
    (args.out / "anatomy_table.html").write_text(
        f"<html><body style='font-family:sans-serif'><h3>{lines[0][2:]}</h3><table border=1 "
        f"cellpadding=4><tr><th>family</th><th>kernels/step</th><th>time/step (us)</th>"
        f"<th>share</th></tr>{html_rows}</table><p>{lines[-1] if floor else ''}</p>"
        f"</body></html>")
    log("anatomy:\n" + "\n".join(lines))

    # -- telemetry on vs off, alternated; GPM during the on runs ---------------------------
    eng_off = make_engine(model, args, telemetry=False)
    for e in (eng, eng_off):
        e.configure(async_batching=True, cuda_graphs=graphs_ok)
        e.generate(prompts[:4], params(8))
    pairs = []
    gpm: list[dict[str, Any]] = []
    for k in range(args.pairs):
        t_on0 = time.perf_counter_ns()
        on = measured_run(eng, prompts, args.new, None, profile=False)["tok_s"]
        t_on1 = time.perf_counter_ns()
        gpm += [{"dram_bw_util_pct": x.dram_bw_util_pct, "sm_util_pct": x.sm_util_pct,
                 "sm_occupancy_pct": x.sm_occupancy_pct, "gpu_util_pct": x.gpu_util_pct}
                for x in nvml.history() if t_on0 <= x.t_ns <= t_on1]
        t = time.perf_counter()
        eng_off.generate(prompts, params(args.new))
        off = args.requests * args.new / (time.perf_counter() - t)
        pairs.append({"on_tok_s": on, "off_tok_s": off, "cost_pct": 100 * (1 - on / off)})
        log(f"pair {k}: {json.dumps(pairs[-1])}")
    eng_off.shutdown()
    eng.shutdown()
    nvml.close()

    def mean(key: str) -> float | None:
        vals = [x[key] for x in gpm if x[key] is not None]
        return statistics.fmean(vals) if vals else None

    results["telemetry_cost"] = {"pairs": pairs, "median_cost_pct": statistics.median(
        p["cost_pct"] for p in pairs)}
    results["gpm"] = {"reason": nvml.gpm_reason, "readings": len(gpm),
                      **{f"mean_{k}": mean(k) for k in ("dram_bw_util_pct", "sm_util_pct",
                                                       "sm_occupancy_pct", "gpu_util_pct")}}
    meta = {"preset": args.preset, "requests": args.requests, "prompt": args.prompt,
            "new": args.new, "profile_new": args.profile_new, "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "date": time.strftime("%Y-%m-%d"), "total_s": time.perf_counter() - T0}
    (args.out / "bench_telemetry_truth.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    report(results, meta, args.out)


def report(results: dict[str, Any], meta: dict[str, Any], out: Path) -> None:
    lines = [f"# bench_telemetry_truth {meta['date']} {meta['device']} torch {meta['torch']}: "
             f"{meta['preset']}, {meta['requests']} x {meta['prompt']} prompt; profiled "
             f"{meta['profile_new']} new tokens, plain {meta['new']}; {meta['total_s']:.0f} s",
             "", "| mode | kernel busy (torch.profiler) | kernel busy (ours, est.) | diff (pp) "
             "| step busy (ours) | old stream-event busy | plain: wall (s) | step busy | "
             "top idle causes |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for mode, r in results.items():
        if "profiled" not in r:
            continue
        p, q = r["profiled"], r["plain"]
        prof, est = p.get("profiler_kernel_busy"), p.get("kernel_busy_est")
        diff = "n/a" if prof is None or est is None else f"{100 * (est - prof):+.2f}"
        causes = sorted(q.get("idle_by_cause_s", {}).items(), key=lambda kv: -kv[1])[:2]
        cause_txt = ", ".join(f"{CAUSE_LABELS[c]} {s * 1000:.0f} ms" for c, s in causes)
        lines.append(f"| {mode} | {pct(prof)} | {pct(est)} | {diff} | {pct(p.get('step_busy'))}"
                     f" | {pct(p.get('stream_event_busy'))} | {q['wall_s']:.2f} | "
                     f"{pct(q.get('step_busy'))} | {cause_txt} |")
    for mode, r in results.items():
        if "predicted_async_s" in r:
            lines.append(f"\n{mode}: predicted async {r['predicted_async_s']:.2f} s vs measured "
                         f"async {r.get('measured_async_s', float('nan')):.2f} s (sync "
                         f"{r['plain']['wall_s']:.2f} s; CPU on the critical path "
                         f"{r['cpu_on_critical_path_s']:.2f} s)")
    c, g = results["telemetry_cost"], results["gpm"]
    lines.append("\ntelemetry on vs off (tok/s): " + ", ".join(
        f"{p['on_tok_s']:.0f} vs {p['off_tok_s']:.0f} ({p['cost_pct']:+.2f}%)"
        for p in c["pairs"]) + f"; median cost {c['median_cost_pct']:+.2f}%")
    def gpm_pct(key: str) -> str:
        return "n/a" if g[key] is None else f"{g[key]:.1f}%"

    lines.append(f"GPM ({g['reason']}): {g['readings']} readings during the on runs; memory "
                 f"bandwidth used {gpm_pct('mean_dram_bw_util_pct')}, SM util "
                 f"{gpm_pct('mean_sm_util_pct')}, SM occupancy "
                 f"{gpm_pct('mean_sm_occupancy_pct')}, NVML util {gpm_pct('mean_gpu_util_pct')}")
    text = "\n".join(lines) + "\n"
    (out / "bench_telemetry_truth.md").write_text(text)
    print("\n" + text, flush=True)


if __name__ == "__main__":
    main()
