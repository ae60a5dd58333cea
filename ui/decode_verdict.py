"""Is one mode faster than another? Decode-only throughput and busy, with a 95% interval.

Owns the verdict the A/B and Recordings pages print. It compares like with like: only
decode-only steps (no prefill token) count towards throughput and compute busy, because one
prefill step of 2,048 tokens takes as long as dozens of decode steps and widens any spread
it falls into; prefill is reported apart. A decode-only step's period is the time from the
previous step's end to its own end (completions follow one another in both modes), its
compute busy is the compute lane's time inside that period.

The interval comes from one of two sources, and the text says which:

- **alternated runs** (three or more pairs A, B, A, B, ...): a t-interval over the pairs'
  log-ratios (throughput) or differences (busy), so a slow moment of the machine that hits
  one pair widens the interval instead of faking a difference;
- **block bootstrap** (a single window per side, e.g. the two modes of a recording): the
  decode-only steps are cut into blocks of consecutive steps, blocks are drawn with
  replacement (2,000 resamples, fixed seed), and the 2.5-97.5 percentiles of the resampled
  difference are the interval.

"No measurable difference" is said only when the interval holds zero *and* stays within
NEGLIGIBLE_PCT of it; an interval that holds zero but is wide says the data cannot tell.
Pure functions: no streamlit, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from telemetry.metrics import busy_intervals
from telemetry.records import StepRecord
from ui.window_stats import covered

RESAMPLES = 2000
SEED = 0
BLOCK_STEPS = 8  # consecutive steps kept together: a step's time depends on its neighbours
MIN_BLOCKS = 5
MIN_PAIRS = 3
NEGLIGIBLE_PCT = 2.0  # an interval inside +-2% (or +-2 pp of busy) is "no measurable difference"
# Two-sided 95% t quantiles by degrees of freedom (pairs - 1); 1.96 beyond the table.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


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


def _end(rec: StepRecord) -> int:
    return max(s.end_ns for s in rec.spans)


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
    ends = np.array([_end(r) for r in recs], dtype=np.int64)
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


@dataclass(slots=True, frozen=True)
class Interval:
    """An estimate with its 95% interval; ``method`` says where the interval comes from."""

    estimate: float
    lo: float
    hi: float
    method: str

    def holds_zero(self) -> bool:
        return self.lo <= 0.0 <= self.hi


def _t95(df: int) -> float:
    for k in sorted(T95):
        if df <= k:
            return T95[k]
    return 1.96


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


def compare_runs(
    a: Sequence[DecodeSteps], b: Sequence[DecodeSteps]
) -> tuple[Interval, Interval] | None:
    """(throughput change of b over a in %, busy change in percentage points), or None when
    a side has too few decode-only steps for an interval."""
    if not (enough_steps(a) and enough_steps(b)):
        return None
    if len(a) == len(b) >= MIN_PAIRS:
        ratio = np.log([rb.tokens_per_s / ra.tokens_per_s for ra, rb in zip(a, b, strict=True)])
        diff = np.array([100 * (rb.busy - ra.busy) for ra, rb in zip(a, b, strict=True)])
        t = _t95(len(a) - 1)
        method = f"t-interval over {len(a)} alternated pairs of runs"
        out = []
        for values, to_pct in ((ratio, True), (diff, False)):
            half = t * values.std(ddof=1) / np.sqrt(values.size)
            m = values.mean()
            if to_pct:
                out.append(Interval(100 * np.expm1(m), 100 * np.expm1(m - half),
                                    100 * np.expm1(m + half), method))
            else:
                out.append(Interval(float(m), float(m - half), float(m + half), method))
        return out[0], out[1]
    rng = np.random.default_rng(SEED)
    ta, tb = _resampled(a, rng), _resampled(b, rng)
    tput = 100 * ((tb[:, 1] / tb[:, 0]) / (ta[:, 1] / ta[:, 0]) - 1)
    busy = 100 * (tb[:, 2] / tb[:, 0] - ta[:, 2] / ta[:, 0])
    method = bootstrap_method(a, b)
    (rate_a, busy_a), (rate_b, busy_b) = pooled(a), pooled(b)
    est_t = 100 * (rate_b / rate_a - 1)
    est_b = 100 * (busy_b - busy_a)
    lo_t, hi_t = np.percentile(tput, [2.5, 97.5])
    lo_b, hi_b = np.percentile(busy, [2.5, 97.5])
    return (Interval(float(est_t), float(lo_t), float(hi_t), method),
            Interval(float(est_b), float(lo_b), float(hi_b), method))


def pooled(runs: Sequence[DecodeSteps]) -> tuple[float, float]:
    """Decode tokens/s and compute busy (0..1) over every run of a side."""
    period = sum(float(r.period_ns.sum()) for r in runs)
    tokens = sum(float(r.tokens.sum()) for r in runs)
    busy = sum(float(r.busy_ns.sum()) for r in runs)
    return (tokens / period * 1e9, busy / period) if period else (float("nan"), float("nan"))


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


def signed(x: float, unit: str) -> str:
    return f"{x:+.1f}{unit}".replace("-", "\u2212")


def decode_verdict(
    a_runs: Sequence[Sequence[StepRecord]],
    b_runs: Sequence[Sequence[StepRecord]],
    *,
    a_label: str,
    b_label: str,
) -> DecodeVerdict:
    """The verdict in words (markdown), from each side's runs (one list of steps a run)."""
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
    ci = f"95% interval {signed(tput.lo, '%')} to {signed(tput.hi, '%')}"
    if not tput.holds_zero():
        word = "faster" if tput.estimate > 0 else "slower"
        head = (f"**Decode throughput: {b_label} is {abs(tput.estimate):.1f}% {word} than "
                f"{a_label}** ({ci}; {figures}).")
    elif max(abs(tput.lo), abs(tput.hi)) <= NEGLIGIBLE_PCT:
        head = (f"**Decode throughput: no measurable difference** between {a_label} and "
                f"{b_label}: {signed(tput.estimate, '%')} ({ci}, inside "
                f"\u00b1{NEGLIGIBLE_PCT:g}%; {figures}).")
    else:
        head = (f"**Decode throughput: not settled by this data.** {b_label} vs {a_label}: "
                f"{signed(tput.estimate, '%')}, but the {ci} holds no change ({figures}). "
                "Capture longer or repeat.")
    busy_text = (f"Compute busy on decode-only steps: {a_label} {100 * ba:.1f}%, {b_label} "
                 f"{100 * bb:.1f}% ({signed(busy.estimate, ' pp')}, 95% interval "
                 f"{signed(busy.lo, ' pp')} to {signed(busy.hi, ' pp')}).")
    text = f"{head} {busy_text} Interval: {tput.method}. {prefill}"
    return DecodeVerdict(not tput.holds_zero(), tput, busy, text)
