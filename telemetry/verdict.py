"""Is B faster than A? The one A/B verdict, with its 95% interval, for the dashboard and bench.

Owns the statistics and the words of every "is A faster than B" on screen or in a bench table:
the Benchmark page (total time of alternated runs), the A/B, Recordings and Diff pages (decode
throughput and compute busy of step records) and `python -m bench ab` (every figure of a
suite, over alternated rounds). The change of B over A comes with a 95% interval from one of
two sources, and the text says which:

- **alternated pairs** (A, B, A, B, ...: at least MIN_PAIRS of them): a t-interval over the
  pairs' log-ratios (a rate or a time: the change in %) or differences (a share: the change
  in percentage points), so a slow moment of the machine that hits one pair widens the
  interval instead of faking a difference;
- **block bootstrap** (one window of steps per side, e.g. the two modes of a recording): the
  decode-only steps are cut into blocks of consecutive steps, blocks are drawn with
  replacement (RESAMPLES times, fixed seed), and the 2.5-97.5 percentiles of the resampled
  change are the interval. The Diff page's step times by kind and batch size compare their
  medians the same way (median_change), each side's blocks redrawn within it.

The words follow the interval alone: B is faster (or slower, higher, lower) when it excludes
zero; "no measurable difference" only when it holds zero *and* stays within NEGLIGIBLE_PCT of
it; "not settled" when it holds zero but is wider (a large difference in noisy data must never
read as none); too few measurements are said, not judged.

Decode throughput compares like with like: only decode-only steps (no prefill token) count,
because one prefill step of thousands of tokens takes as long as dozens of decode steps and
widens any interval it falls into; prefill is reported apart. A decode-only step's period is
the time from the previous step's end to its own end, its compute busy the compute lane's
time inside that period.

Pure: numpy and telemetry only; it must never import streamlit, plotly, torch or the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from telemetry.metrics import busy_intervals
from telemetry.records import StepRecord

NEGLIGIBLE_PCT = 2.0  # an interval inside +-2% (or +-2 pp) is "no measurable difference"
MIN_PAIRS = 3
RESAMPLES = 2000
SEED = 0
BLOCK_STEPS = 8  # consecutive steps kept together: a step's time depends on its neighbours
MIN_BLOCKS = 5
# Two-sided 95% t quantiles by degrees of freedom (pairs - 1); 1.96 beyond the table.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


@dataclass(slots=True, frozen=True)
class Interval:
    """An estimate with its 95% interval; ``method`` says where the interval comes from."""

    estimate: float
    lo: float
    hi: float
    method: str

    def holds_zero(self) -> bool:
        return self.lo <= 0.0 <= self.hi


def t95(df: int) -> float:
    """The two-sided 95% t quantile for ``df`` degrees of freedom (the next table entry up)."""
    for k in sorted(T95):
        if df <= k:
            return T95[k]
    return 1.96


def pairs_method(n: int) -> str:
    return f"t-interval over {n} alternated pairs of runs"


def paired_change(a: Sequence[float], b: Sequence[float]) -> Interval | None:
    """The change of B over A in %, from alternated pairs (a[i], b[i]): a t-interval over the
    pairs' log-ratios. None with fewer than MIN_PAIRS pairs or a value that is not positive."""
    n = min(len(a), len(b))
    xa, xb = np.asarray(a[:n], dtype=float), np.asarray(b[:n], dtype=float)
    if n < MIN_PAIRS or not (np.all(xa > 0) and np.all(xb > 0)):
        return None
    logs = np.log(xb / xa)
    half = t95(n - 1) * logs.std(ddof=1) / np.sqrt(n)
    m = logs.mean()
    return Interval(float(100 * np.expm1(m)), float(100 * np.expm1(m - half)),
                    float(100 * np.expm1(m + half)), pairs_method(n))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Interval | None:
    """B - A in A's units, from alternated pairs: a t-interval over the differences. None with
    fewer than MIN_PAIRS pairs."""
    n = min(len(a), len(b))
    if n < MIN_PAIRS:
        return None
    d = np.asarray(b[:n], dtype=float) - np.asarray(a[:n], dtype=float)
    half = t95(n - 1) * d.std(ddof=1) / np.sqrt(n)
    m = d.mean()
    return Interval(float(m), float(m - half), float(m + half), pairs_method(n))


def signed(x: float, unit: str) -> str:
    return f"{x:+.1f}{unit}".replace("-", "\u2212")


@dataclass(slots=True, frozen=True)
class Verdict:
    measurable: bool  # the interval excludes zero
    change: Interval | None  # of B over A, in %
    text: str  # markdown
    # In a word: faster, slower, higher, lower, "no measurable difference", "not settled" or
    # "too few" (no interval)
    kind: str = "too few"


def judge(change: Interval | None, *, what: str, a_label: str, b_label: str,
          higher_is_better: bool | None = True, figures: str = "",
          too_few: str = "too few measurements to judge") -> Verdict:
    """The verdict in words on ``change`` (B over A in %, with its 95% interval).
    ``higher_is_better``: True for a rate (higher is faster), False for a time (lower is
    faster), None for a figure with no direction (higher / lower). ``figures`` is quoted in
    brackets; ``too_few`` is said when there is no interval."""
    tail = f"; {figures}" if figures else ""
    brackets = f" ({figures})" if figures else ""
    if change is None:
        return Verdict(False, None, f"**{what}: {too_few}**{brackets}. Repeat to tell.",
                       "too few")
    ci = f"95% interval {signed(change.lo, '%')} to {signed(change.hi, '%')}"
    if not change.holds_zero():
        up = change.estimate > 0
        if higher_is_better is None:
            word = "higher" if up else "lower"
        else:
            word = "faster" if up == higher_is_better else "slower"
        return Verdict(True, change, f"**{what}: {b_label} is {abs(change.estimate):.1f}% "
                       f"{word} than {a_label}** ({ci}{tail}).", word)
    if max(abs(change.lo), abs(change.hi)) <= NEGLIGIBLE_PCT:
        return Verdict(False, change, f"**{what}: no measurable difference** between "
                       f"{a_label} and {b_label}: {signed(change.estimate, '%')} ({ci}, inside "
                       f"\u00b1{NEGLIGIBLE_PCT:g}%{tail}).", "no measurable difference")
    return Verdict(False, change, f"**{what}: not settled by this data.** {b_label} vs "
                   f"{a_label}: {signed(change.estimate, '%')}, but the {ci} holds no change"
                   f"{brackets}. Repeat with more runs to tell.", "not settled")


@dataclass(slots=True, frozen=True)
class Spread:
    """Median and range of repeated measurements of one figure."""

    median: float
    lo: float
    hi: float
    n: int


def spread(values: Sequence[float | None]) -> Spread:
    """Median and range of the finite values. Raises ValueError when there is none."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        raise ValueError("spread needs at least one finite value")
    return Spread(float(np.median(arr)), float(arr.min()), float(arr.max()), int(arr.size))


def runs_verdict(a: Sequence[float], b: Sequence[float], *, what: str, a_label: str,
                 b_label: str, higher_is_better: bool | None = True, unit: str = "",
                 fmt: str = ",.2f") -> Verdict:
    """B against A on one figure of alternated runs: a[i] and b[i] ran in the same repetition
    (a side's runs in the order they ran; unmatched extra runs are left out of the pairs)."""
    sa, sb = spread(a), spread(b)
    n = min(len(a), len(b))
    figures = (f"{a_label} {sa.median:{fmt}}{unit} ({sa.lo:{fmt}}-{sa.hi:{fmt}}), {b_label} "
               f"{sb.median:{fmt}}{unit} ({sb.lo:{fmt}}-{sb.hi:{fmt}}), medians of {sa.n} and "
               f"{sb.n} runs")
    change = paired_change(a, b)
    if change is not None:
        figures += f"; {change.method}"
    return judge(change, what=what, a_label=a_label, b_label=b_label,
                 higher_is_better=higher_is_better, figures=figures,
                 too_few=f"{n} alternated pair{'s' if n != 1 else ''} of runs, at least "
                         f"{MIN_PAIRS} needed to judge")


# ---------------------------------------------------------------- one figure's median


def _resampled_medians(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(RESAMPLES,) medians of ``x`` (in time order) with its blocks of consecutive values
    redrawn with replacement; the last block may be shorter (its gaps are NaN, skipped)."""
    size = max(1, min(BLOCK_STEPS, x.size // MIN_BLOCKS))
    n_blocks = -(-x.size // size)
    padded = np.full(n_blocks * size, np.nan)
    padded[:x.size] = x
    blocks = padded.reshape(n_blocks, size)
    out = np.empty(RESAMPLES)
    chunk = max(1, 2_000_000 // (n_blocks * size))  # resamples at a time: bounded memory
    for i in range(0, RESAMPLES, chunk):
        k = min(chunk, RESAMPLES - i)
        idx = rng.integers(0, n_blocks, size=(k, n_blocks))
        out[i:i + k] = np.nanmedian(blocks[idx].reshape(k, -1), axis=1)
    return out


def median_method(n_a: int, n_b: int) -> str:
    return (f"block bootstrap of the medians of {n_a:,} and {n_b:,} steps (blocks of up to "
            f"{BLOCK_STEPS} consecutive steps, {RESAMPLES:,} resamples)")


def median_change(a: Sequence[float], b: Sequence[float]) -> Interval | None:
    """The change of B's median over A's in %, from each side's values in time order (a
    step time per step): a block bootstrap, each side's blocks of consecutive values redrawn
    within it (a step's time depends on its neighbours), and the 2.5-97.5 percentiles of
    the resampled change. None with fewer than MIN_BLOCKS values a side or a value that is
    not positive."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < MIN_BLOCKS or xb.size < MIN_BLOCKS or not (np.all(xa > 0) and np.all(xb > 0)):
        return None
    rng = np.random.default_rng(SEED)
    change = 100 * (_resampled_medians(xb, rng) / _resampled_medians(xa, rng) - 1)
    lo, hi = np.percentile(change, [2.5, 97.5])
    estimate = 100 * (np.median(xb) / np.median(xa) - 1)
    return Interval(float(estimate), float(lo), float(hi), median_method(xa.size, xb.size))


def median_verdict(a: Sequence[float], b: Sequence[float], *, what: str, a_label: str,
                   b_label: str) -> Verdict:
    """The verdict in words on a time (lower is faster) whose medians are compared: B's
    median over A's with its 95% interval (median_change)."""
    return judge(median_change(a, b), what=what, a_label=a_label, b_label=b_label,
                 higher_is_better=False,
                 too_few=f"{len(a)} and {len(b)} steps, at least {MIN_BLOCKS} a side needed "
                         "to judge")


# ---------------------------------------------------------------- decode-only step records


@dataclass(slots=True, frozen=True)
class DecodeSteps:
    """One run's decode-only steps (arrays, one entry a step) and its prefill apart."""

    period_ns: np.ndarray
    tokens: np.ndarray
    busy_ns: np.ndarray
    prefill_steps: int
    prefill_tokens: int
    prefill_ns: int

    @property
    def n(self) -> int:
        return int(self.period_ns.size)

    @property
    def tokens_per_s(self) -> float:
        total = self.period_ns.sum()
        return float(self.tokens.sum() / total * 1e9) if total else float("nan")

    @property
    def busy(self) -> float:
        total = self.period_ns.sum()
        return float(self.busy_ns.sum() / total) if total else float("nan")


def covered(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of [a_i, b_i] covered by the disjoint sorted intervals (starts, ends)."""
    if starts.size == 0:
        return np.zeros(a.shape, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(ends - starts)))

    def upto(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, x, side="right")  # intervals starting at or before x
        over = np.where(k > 0, np.maximum(ends[np.maximum(k - 1, 0)] - x, 0), 0)
        return cum[k] - over

    return upto(b) - upto(a)


def decode_steps(records: Sequence[StepRecord]) -> DecodeSteps:
    """Split a run's steps (one mode, consecutive) into decode-only figures and prefill.

    The first step has no predecessor, so no period: it is left out of the decode figures
    and of the prefill time (its prompt tokens still count).
    """
    recs = sorted((r for r in records if r.spans), key=lambda r: r.step)
    empty = np.empty(0, dtype=np.int64)
    n_prefill = sum(1 for r in recs if r.prefill_tokens > 0)
    prompt_tokens = sum(r.prefill_tokens for r in recs)
    if len(recs) < 2:
        return DecodeSteps(empty, empty, empty, n_prefill, prompt_tokens, 0)
    ends = np.array([r.end_ns for r in recs], dtype=np.int64)
    lo = min(s.start_ns for r in recs for s in r.spans)
    bs, be = busy_intervals([s for r in recs for s in r.spans], lo, int(ends.max()))
    starts, stops = ends[:-1], ends[1:]
    periods = stops - starts
    busy = covered(bs, be, starts, stops)
    decode = np.array([r.prefill_tokens == 0 and r.decode_tokens > 0 for r in recs[1:]])
    tokens = np.array([r.decode_tokens for r in recs[1:]], dtype=np.int64)
    prefill = np.array([r.prefill_tokens for r in recs[1:]], dtype=np.int64)
    keep = decode & (periods > 0)
    return DecodeSteps(
        period_ns=periods[keep], tokens=tokens[keep], busy_ns=busy[keep],
        prefill_steps=n_prefill, prefill_tokens=prompt_tokens,
        prefill_ns=int(periods[prefill > 0].sum()),  # the first step has no period
    )


def _block_sums(run: DecodeSteps) -> np.ndarray:
    """(blocks, 3) sums of period, tokens, busy over consecutive blocks of steps."""
    size = max(1, min(BLOCK_STEPS, run.n // MIN_BLOCKS))
    cols = np.stack([run.period_ns, run.tokens, run.busy_ns], axis=1).astype(float)
    edges = np.arange(0, run.n, size)
    return np.add.reduceat(cols, edges, axis=0)


def _resampled(runs: Sequence[DecodeSteps], rng: np.random.Generator) -> np.ndarray:
    """(RESAMPLES, 3) totals of period, tokens, busy: blocks redrawn within each run."""
    total = np.zeros((RESAMPLES, 3))
    for run in runs:
        blocks = _block_sums(run)
        idx = rng.integers(0, len(blocks), size=(RESAMPLES, len(blocks)))
        total += blocks[idx].sum(axis=1)
    return total


def bootstrap_method(a: Sequence[DecodeSteps], b: Sequence[DecodeSteps]) -> str:
    n = sum(r.n for r in a) + sum(r.n for r in b)
    return (f"block bootstrap of the {n:,} decode-only steps (blocks of up to {BLOCK_STEPS} "
            f"consecutive steps, {RESAMPLES:,} resamples)")


def enough_steps(runs: Sequence[DecodeSteps]) -> bool:
    return bool(runs) and all(r.n >= 2 for r in runs) and sum(r.n for r in runs) >= MIN_BLOCKS


def pooled(runs: Sequence[DecodeSteps]) -> tuple[float, float]:
    """Decode tokens/s and compute busy (0..1) over every run of a side."""
    period = sum(float(r.period_ns.sum()) for r in runs)
    tokens = sum(float(r.tokens.sum()) for r in runs)
    busy = sum(float(r.busy_ns.sum()) for r in runs)
    return (tokens / period * 1e9, busy / period) if period else (float("nan"), float("nan"))


def compare_runs(
    a: Sequence[DecodeSteps], b: Sequence[DecodeSteps]
) -> tuple[Interval, Interval] | None:
    """(throughput change of b over a in %, busy change in percentage points), or None when
    a side has too few decode-only steps for an interval."""
    if not (enough_steps(a) and enough_steps(b)):
        return None
    if len(a) == len(b) >= MIN_PAIRS:
        tput = paired_change([r.tokens_per_s for r in a], [r.tokens_per_s for r in b])
        busy = paired_difference([100 * r.busy for r in a], [100 * r.busy for r in b])
        if tput is not None and busy is not None:
            return tput, busy
    rng = np.random.default_rng(SEED)
    ta, tb = _resampled(a, rng), _resampled(b, rng)
    tput_r = 100 * ((tb[:, 1] / tb[:, 0]) / (ta[:, 1] / ta[:, 0]) - 1)
    busy_r = 100 * (tb[:, 2] / tb[:, 0] - ta[:, 2] / ta[:, 0])
    method = bootstrap_method(a, b)
    (rate_a, busy_a), (rate_b, busy_b) = pooled(a), pooled(b)
    lo_t, hi_t = np.percentile(tput_r, [2.5, 97.5])
    lo_b, hi_b = np.percentile(busy_r, [2.5, 97.5])
    return (Interval(float(100 * (rate_b / rate_a - 1)), float(lo_t), float(hi_t), method),
            Interval(float(100 * (busy_b - busy_a)), float(lo_b), float(hi_b), method))


@dataclass(slots=True, frozen=True)
class DecodeVerdict:
    measurable: bool  # the throughput interval excludes zero
    throughput: Interval | None
    busy: Interval | None
    text: str


def prefill_text(label: str, runs: Sequence[DecodeSteps]) -> str:
    steps = sum(r.prefill_steps for r in runs)
    tokens = sum(r.prefill_tokens for r in runs)
    ms = sum(r.prefill_ns for r in runs) / 1e6
    if not steps:
        return f"{label}: no prefill step."
    took = f" in {ms:,.1f} ms" if ms else ""
    return f"{label}: {steps:,} step{'s' if steps > 1 else ''}, {tokens:,} prompt tokens{took}."


def decode_verdict(
    a_runs: Sequence[Sequence[StepRecord]],
    b_runs: Sequence[Sequence[StepRecord]],
    *,
    a_label: str,
    b_label: str,
) -> DecodeVerdict:
    """The verdict in words (markdown) on decode throughput, from each side's runs (one list
    of steps a run), with compute busy and prefill beside it."""
    a = [decode_steps(r) for r in a_runs]
    b = [decode_steps(r) for r in b_runs]
    (ta, ba), (tb, bb) = pooled(a), pooled(b)
    prefill = "Prefill, left out of the figures above: " + " ".join(
        prefill_text(label, side) for label, side in ((a_label, a), (b_label, b)))
    got = compare_runs(a, b)
    if got is None:
        counts = f"{sum(r.n for r in a)} and {sum(r.n for r in b)}"
        return DecodeVerdict(False, None, None, (
            f"Decode throughput: too few decode-only steps to judge ({counts}; at least "
            f"{MIN_BLOCKS} a side, two a run). Capture longer or under more load. {prefill}"))
    tput, busy = got
    figures = (f"{b_label} {tb:,.0f} vs {a_label} {ta:,.0f} decode tokens/s over "
               f"{sum(r.n for r in b):,} and {sum(r.n for r in a):,} decode-only steps")
    head = judge(tput, what="Decode throughput", a_label=a_label, b_label=b_label,
                 figures=figures)
    busy_text = (f"Compute busy on decode-only steps: {a_label} {100 * ba:.1f}%, {b_label} "
                 f"{100 * bb:.1f}% ({signed(busy.estimate, ' pp')}, 95% interval "
                 f"{signed(busy.lo, ' pp')} to {signed(busy.hi, ' pp')}).")
    text = f"{head.text} {busy_text} Interval: {tput.method}. {prefill}"
    return DecodeVerdict(head.measurable, tput, busy, text)
