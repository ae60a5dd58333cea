"""The prefill tax: what a prefill chunk adds to the inter-token latency of the running decodes.

Owns the model of a step's time as a function of what it carries, fitted over a sliding window
of step records, and every figure derived from it: each step's kind, its split between its
decode tokens and its prefill tokens, what 1,000 prefill tokens add to every running request's
inter-token latency (ITL), the ITL of decode-only steps beside steps that carried a prefill
chunk, the device time spent on decode, on prefill and idle, and the what-if over token budgets
(``max_num_batched_tokens``). Pure functions over StepRecords (numpy only); it must never read
the bus or a clock, never import a UI library, and never invent a term the window cannot fit.

**The time fitted** is the step's *period*: from the later of the previous step's end and the
step's own first span to its own end (``StepRecord.end_ns``). Every request that rode two
consecutive steps got its tokens at their ends, so the period is exactly the ITL a running
request waits, on any device and in either mode: on a GPU in async mode the CPU's work of the
next step overlaps the device and the period is the device's time plus what the CPU could not
hide; on a CPU, or a small model whose steps are CPU-bound, the compute span alone would leave
out the preparation and the post-processing that the request waits through as well. The start is
clipped at the step's first span so that an idle engine's wait for work never counts as a step's
time. ``source="compute"`` fits the compute span instead (the device's own cost of the step), for
a device-bound GPU window where the period's CPU jitter would only widen the fit.

**The model** (least squares, one row a step):

    time = intercept + b_decode * decode_tokens + b_prefill * prefill_tokens
           + b_context * context_tokens

``context_tokens`` is the sum over the step's tokens of the context each attends to (a decode
token at context c reads c; a prefill chunk of n tokens ending at e reads e + (e-1) + ... +
(e-n+1)): the attention's work, linear in the decode contexts and quadratic in a chunk. A term
whose column does not vary in the window (eight streams always decoding: the decode count is
constant), or varies in fewer than MIN_VARIED_STEPS steps, cannot be told from the intercept and
is left out of the fit, with the reason; a window without a single prefill step has no prefill
term, and every figure that needs it says so instead of inventing it.

**The error**: the residual standard error s (RMSE with n - p degrees of freedom). On a shared
machine slow stretches make neighbouring steps slow together, so the residuals' autocorrelation
rho_j (steps j apart, up to MAX_LAG, negative as 0) widens every interval: with
f = 1 + 2 * sum_j (1 - j/(J+1)) rho_j, a coefficient's 95% interval is
b +- t * s * sqrt(f (X'X)^-1); a new step's 95% prediction interval is
y +- t * s * sqrt(1 + f x'(X'X)^-1 x); the mean of a set of new steps' is
y +- t * s * sqrt(sum_ab rho_|a-b| / k^2 + f x'(X'X)^-1 x) at their mean x (k steps, a and b
their step numbers; k steps far apart give 1/k). t: telemetry.verdict.t95. A step's own noise
grows with its length on a shared machine (a slow stretch stretches a long step more), so the
noise term of a step with a prefill chunk is the RMSE of such steps, and of a decode-only step
that of decode-only steps, where the window holds MIN_KIND_STEPS of them: over all the window's
steps of that kind, outliers included (the band is the spread a request meets).

**Outliers**: a step slower than the fit by OUTLIER_SCALES robust SDs (1.4826 x the residuals'
median absolute deviation) and by OUTLIER_FRACTION of its predicted time is an outlier (a GC
pause, a descheduled thread: what a shared machine does; telemetry/stalls.py names the causes of
slow steps), not the cost of its tokens: the fit is made
again without it (up to OUTLIER_PASSES times) and names it in ``outliers``. Only slow steps are
left out, and only far slower ones: a GPU's steady decodes give a tiny scale, and a chunk the
linear model fits a few percent off must stay in.

**A step's split**: its decode share is what the step would cost without its prefill tokens
(the intercept, the decode term and its decode tokens' context); its prefill share is the rest
of the model (the prefill term and the context its chunks read): the tax a prefill chunk levies
on the decodes that share its step. Both are scaled to the step's measured time.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from telemetry.latency import Distribution, distribution
from telemetry.metrics import busy_intervals
from telemetry.records import StepRecord
from telemetry.verdict import Interval, t95

StepKind = Literal["decode-only", "mixed", "prefill-only"]
TimeSource = Literal["period", "compute"]
Term = Literal["decode", "prefill", "context"]

TERMS: tuple[Term, ...] = ("decode", "prefill", "context")
WINDOW_STEPS = 256  # the sliding window: the last this many steps
MIN_STEPS = 8  # fewer steps than this, or than terms + 3, fit nothing
# A term fitted from one or two odd steps (the streams' own admission) is their noise: a term
# needs this many steps whose value differs from the window's most common one.
MIN_VARIED_STEPS = 3
MAX_LAG = 16  # residual autocorrelation is counted up to this many steps apart
# A step slower than the fit by this many robust SDs and by this share of its predicted time
# is an outlier (a GC pause, a descheduled thread), not the cost of its tokens: left out.
OUTLIER_SCALES = 4.0
OUTLIER_FRACTION = 1.0
OUTLIER_PASSES = 3
MIN_KIND_STEPS = 3  # steps of a kind for a residual scale of its own
_METHOD = "least squares over {n} steps, t-interval with {dof} degrees of freedom"


def step_kind(rec: StepRecord) -> StepKind:
    """decode-only (no prefill token), mixed (decode tokens and a prefill chunk) or
    prefill-only (no decode token)."""
    if rec.prefill_tokens == 0:
        return "decode-only"
    return "mixed" if rec.decode_tokens > 0 else "prefill-only"


def _chunk_context(tokens: int, end: int) -> int:
    """Sum of the contexts the chunk's tokens attend to: end + (end - 1) + ... + (end-n+1)."""
    return tokens * end - tokens * (tokens - 1) // 2


def context_tokens(rec: StepRecord) -> tuple[int, int]:
    """(decode context, prefill context) of a step: the sum over its decode tokens, and over its
    prefill tokens, of the context each attends to. A decode chunk is one token; when a step
    holds more one-token chunks than decode tokens (the last token of a prompt), the extra ones
    are counted as prefill. (0, 0) when the step has no chunks (telemetry off)."""
    decode = prefill = 0
    ones_left = rec.decode_tokens
    for _, n, end in rec.chunks:
        n, end = int(n), int(end)
        if n == 1 and ones_left > 0:
            decode += end
            ones_left -= 1
        else:
            prefill += _chunk_context(n, end)
    return decode, prefill


@dataclass(slots=True, frozen=True)
class TimedStep:
    """One step as the fit sees it: its measured time and its regressors."""

    step: int
    kind: StepKind
    time_ns: int
    decode_tokens: int
    prefill_tokens: int
    decode_context: int
    prefill_context: int

    @property
    def context(self) -> int:
        return self.decode_context + self.prefill_context


def _compute_ns(rec: StepRecord) -> int:
    return sum(s.end_ns - s.start_ns for s in rec.spans if s.lane == "compute")


def timed_steps(records: Sequence[StepRecord], source: TimeSource = "period") -> list[TimedStep]:
    """The steps with a time, in step order. With ``source="period"`` a step's time runs from
    the later of the previous step's end and its own first span to its own end (the first
    step has no previous step and is left out); with "compute" it is its compute span. Steps
    without spans (telemetry off) and with no time are left out."""
    if source not in ("period", "compute"):
        raise ValueError(f"source must be 'period' or 'compute', got {source!r}")
    recs = sorted((r for r in records if r.spans), key=lambda r: r.step)
    out = []
    prev_end: int | None = None
    for r in recs:
        end = r.end_ns
        assert end is not None  # it has spans
        if source == "compute":
            t = _compute_ns(r)
        elif prev_end is None:
            t = 0
        else:
            t = end - max(prev_end, min(s.start_ns for s in r.spans))
        prev_end = end if prev_end is None else max(prev_end, end)
        if t <= 0:
            continue
        dc, pc = context_tokens(r)
        out.append(TimedStep(r.step, step_kind(r), int(t), r.decode_tokens, r.prefill_tokens,
                             dc, pc))
    return out


def _row(terms: Sequence[Term], d: float, p: float, c: float) -> np.ndarray:
    x = {"decode": d, "prefill": p, "context": c}
    return np.array([1.0] + [x[t] for t in terms])


@dataclass(slots=True, frozen=True)
class StepPrediction:
    """A predicted step time (ns) with its 95% interval."""

    mean_ns: float
    lo_ns: float
    hi_ns: float


@dataclass(slots=True, frozen=True)
class TaxFit:
    """A fitted step-time model. ``terms`` are the fitted terms besides the intercept, in the
    order of ``coef_ns[1:]`` (ns per token, per context token); ``left_out`` says, per term
    not fitted, why."""

    source: TimeSource
    terms: tuple[Term, ...]
    coef_ns: tuple[float, ...]
    xtx_inv: tuple[tuple[float, ...], ...]
    rmse_ns: float  # residual standard error, n - p degrees of freedom
    dof: int
    steps: int
    prefill_steps: int
    residuals_ns: tuple[float, ...] = field(repr=False)
    left_out: dict[str, str] = field(default_factory=dict)
    # Autocorrelation of the residuals of steps 1..len(rho) apart, negative ones as 0: a slow
    # stretch of a shared machine makes neighbouring steps slow together.
    rho: tuple[float, ...] = ()
    robust_scale_ns: float = 0.0  # of the residuals (1.4826 x their MAD)
    kind_rmse_ns: dict[str, float] = field(default_factory=dict)  # "decode", "prefill"
    outliers: tuple[int, ...] = ()  # steps far slower than the fit: left out of it

    def is_outlier(self, time_ns: float, predicted_ns: float) -> bool:
        """Whether a step of this time, where the fit predicts ``predicted_ns``, is one the fit
        leaves out (an outlier, not a token's cost)."""
        return _outlier(time_ns - predicted_ns, predicted_ns, self.robust_scale_ns)

    @property
    def t(self) -> float:
        return t95(self.dof)

    @property
    def inflation(self) -> float:
        """How much the residuals' autocorrelation widens the variance of anything summed over
        many steps (the coefficients; Bartlett weights): 1 + 2 * sum_j (1 - j/(J+1)) rho_j."""
        big_j = len(self.rho)
        return 1.0 + 2.0 * sum((1 - j / (big_j + 1)) * r for j, r in enumerate(self.rho, 1))

    def _rho(self, lag: int) -> float:
        if lag == 0:
            return 1.0
        return self.rho[lag - 1] if lag <= len(self.rho) else 0.0

    def has(self, term: Term) -> bool:
        return term in self.terms

    def coef(self, term: Term) -> float:
        """The term's coefficient (ns per unit), 0.0 for a term not fitted."""
        return self.coef_ns[1 + self.terms.index(term)] if term in self.terms else 0.0

    def coefficient(self, term: Term | Literal["intercept"]) -> Interval | None:
        """The coefficient (ns per unit) with its 95% interval; None for a term not fitted."""
        if term != "intercept" and term not in self.terms:
            return None
        i = 0 if term == "intercept" else 1 + self.terms.index(term)
        b = self.coef_ns[i]
        half = self.t * self.rmse_ns * math.sqrt(self.inflation * max(self.xtx_inv[i][i], 0.0))
        return Interval(b, b - half, b + half, _METHOD.format(n=self.steps, dof=self.dof))

    def _x(self, d: float, p: float, c: float) -> np.ndarray:
        return _row(self.terms, d, p, c)

    def mean_ns(self, d: float, p: float, c: float) -> float:
        """The model's step time at d decode tokens, p prefill tokens, c context tokens."""
        return float(self._x(d, p, c) @ np.asarray(self.coef_ns))

    def scale_ns(self, prefill: bool) -> float:
        """The residual scale of steps of that kind (with a prefill chunk, or without): a
        step's noise on a shared machine grows with its length, so a chunk step's is its kind's
        RMSE where the window holds MIN_KIND_STEPS of them, else the whole fit's. A fit without
        the prefill term knows no kinds: the whole fit's."""
        if not self.has("prefill"):
            return self.rmse_ns
        return self.kind_rmse_ns.get("prefill" if prefill else "decode", self.rmse_ns)

    def _interval(self, x: np.ndarray, noise: float, scale: float) -> StepPrediction:
        """The model at x, +- t * sqrt(scale^2 * noise + s^2 * inflation * x'(X'X)^-1 x)."""
        y = float(x @ np.asarray(self.coef_ns))
        lever = max(float(x @ np.asarray(self.xtx_inv) @ x), 0.0)
        half = self.t * math.sqrt(scale**2 * noise + self.rmse_ns**2 * self.inflation * lever)
        return StepPrediction(y, y - half, y + half)

    def predict(self, d: float, p: float, c: float, k: int = 1) -> StepPrediction:
        """The step time at (d, p, c) with the 95% prediction interval of one new step, or of
        the mean of ``k`` new steps far apart (independent) whose regressors average (d, p, c).
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        return self._interval(self._x(d, p, c), 1.0 / k, self.scale_ns(p > 0))

    def predict_steps(self, steps: Sequence[TimedStep]) -> StepPrediction:
        """The mean time of these (new) steps, with the 95% interval of their mean: steps
        that follow one another share the fit's residual autocorrelation (rho), so a run of k
        consecutive steps narrows the interval less than k steps far apart."""
        if not steps:
            raise ValueError("predict_steps needs at least one step")
        d = float(np.mean([s.decode_tokens for s in steps]))
        p = float(np.mean([s.prefill_tokens for s in steps]))
        c = float(np.mean([s.context for s in steps]))
        nums = sorted(s.step for s in steps)
        pairs = sum(self._rho(abs(a - b)) for a in nums for b in nums)
        return self._interval(self._x(d, p, c), pairs / len(nums) ** 2, self.scale_ns(p > 0))

    def decode_part_ns(self, s: TimedStep) -> float:
        """What the step would cost without its prefill tokens: intercept, decode term and
        its decode tokens' context (the model's, not scaled to the measurement)."""
        if s.decode_tokens == 0:
            return 0.0
        return self.coef_ns[0] + self.coef("decode") * s.decode_tokens \
            + self.coef("context") * s.decode_context

    def prefill_part_ns(self, s: TimedStep) -> float:
        """The prefill tokens' share of the step in the model: the prefill term and the
        context the chunks read; the intercept too when the step has no decode token."""
        part = self.coef("prefill") * s.prefill_tokens + self.coef("context") * s.prefill_context
        if s.decode_tokens == 0 and s.prefill_tokens > 0:
            part += self.coef_ns[0]
        return part


@dataclass(slots=True, frozen=True)
class NoFit:
    """Why a window has no fit."""

    reason: str
    steps: int
    prefill_steps: int


def _mode(col: np.ndarray) -> float:
    values, counts = np.unique(col, return_counts=True)
    return float(values[int(np.argmax(counts))])


def _varied_steps(col: np.ndarray) -> int:
    """How many steps' values differ from the window's most common value."""
    return int(np.sum(col != _mode(col))) if col.size else 0


def fit_step_time(records: Sequence[StepRecord], *, window_steps: int = WINDOW_STEPS,
                  source: TimeSource = "period",
                  terms: Sequence[Term] = TERMS,
                  exclude: Collection[int] = ()) -> TaxFit | NoFit:
    """Least-squares fit of step time over the last ``window_steps`` timed steps.

    ``terms`` picks the terms that may enter (a control fit leaves one out); a term whose
    column does not vary, or that the others already explain (collinear), is left out with its
    reason in ``left_out``. ``exclude``: step numbers left out of the fit after every step is
    timed, so a neighbour's period is still timed against them (in async mode the step after
    a left-out one starts during it). Returns NoFit, with the reason, when fewer than
    MIN_STEPS steps (or than the terms + 3) are timed.
    """
    if window_steps < 1:
        raise ValueError(f"window_steps must be at least 1, got {window_steps}")
    bad = [t for t in terms if t not in TERMS]
    if bad:
        raise ValueError(f"terms must be among {TERMS}, got {bad}")
    steps = [s for s in timed_steps(records, source)
             if s.step not in exclude][-window_steps:]
    n_pre = sum(1 for s in steps if s.prefill_tokens > 0)
    if len(steps) < MIN_STEPS:
        return NoFit(f"{len(steps)} timed steps in the window; the fit needs {MIN_STEPS}",
                     len(steps), n_pre)
    y = np.array([s.time_ns for s in steps], dtype=float)
    cols = {"decode": np.array([s.decode_tokens for s in steps], dtype=float),
            "prefill": np.array([s.prefill_tokens for s in steps], dtype=float),
            "context": np.array([s.context for s in steps], dtype=float)}
    left_out: dict[str, str] = {}
    for t in TERMS:
        if t not in terms:
            left_out[t] = "left out of this fit"
    if "prefill" in terms and n_pre == 0:
        left_out["prefill"] = ("no step in the window carried a prefill chunk: the prefill "
                               "term cannot be fitted")
    if "context" in terms and not np.any(cols["context"]):
        left_out["context"] = "the steps carry no contexts (recorded without their chunks)"
    kept: list[Term] = []
    for t in TERMS:  # prefill before context: a chunk's own tokens are the term asked about
        if t in left_out:
            continue
        varied = _varied_steps(cols[t])
        if varied < MIN_VARIED_STEPS:
            mode = _mode(cols[t])
            left_out[t] = (f"{t} tokens were {mode:.0f} in all but {varied} of the window's "
                           f"steps (the fit needs {MIN_VARIED_STEPS} that differ): their cost "
                           "is in the intercept") if varied else \
                (f"{t} tokens did not vary in the window (always {mode:.0f}): their cost is in "
                 "the intercept")
            continue
        x = np.column_stack([np.ones(len(steps))] + [cols[k] for k in (*kept, t)])
        scaled = x / np.maximum(np.abs(x).max(axis=0), 1e-12)
        if np.linalg.matrix_rank(scaled, tol=1e-9) < x.shape[1]:
            left_out[t] = f"{t} tokens move with the other terms in the window: not separable"
            continue
        kept.append(t)
    order = tuple(t for t in TERMS if t in kept)
    p = 1 + len(order)
    if len(steps) < p + 3:
        return NoFit(f"{len(steps)} timed steps for {p} coefficients; the fit needs {p + 3}",
                     len(steps), n_pre)
    x = np.column_stack([np.ones(len(steps))] + [cols[t] for t in order])
    keep = np.ones(len(steps), dtype=bool)
    for _ in range(OUTLIER_PASSES):
        coef, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
        pred = x @ coef
        scale = _robust_scale(y[keep] - pred[keep])
        slow = np.array([_outlier(float(e), float(q), scale) for e, q in zip(y - pred, pred,
                                                                             strict=True)])
        if int(np.sum(~slow)) < p + 3 or np.array_equal(~slow, keep):
            break
        keep = ~slow
    coef, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
    resid = y[keep] - x[keep] @ coef
    dof = int(keep.sum()) - p
    rmse = float(math.sqrt(float(resid @ resid) / dof))
    xtx_inv = np.linalg.pinv(x[keep].T @ x[keep])
    nums = np.array([s.step for s in steps])
    rho = _autocorrelation(resid, nums[keep], int(keep.sum()))
    return TaxFit(source=source, terms=order, coef_ns=tuple(float(b) for b in coef),
                  xtx_inv=tuple(tuple(float(v) for v in row) for row in xtx_inv),
                  rmse_ns=rmse, dof=dof, steps=int(keep.sum()),
                  prefill_steps=sum(1 for s, k in zip(steps, keep, strict=True)
                                    if k and s.prefill_tokens > 0),
                  residuals_ns=tuple(float(r) for r in resid), left_out=left_out, rho=rho,
                  robust_scale_ns=_robust_scale(resid),
                  outliers=tuple(int(n) for n in nums[~keep]),
                  kind_rmse_ns=_kind_rmse(y - x @ coef, cols["prefill"] > 0, dof + int(
                      (~keep).sum())))


def _kind_rmse(resid: np.ndarray, prefill: np.ndarray, dof: int) -> dict[str, float]:
    """The RMSE of the steps with a prefill chunk and of those without, each with the fit's
    degrees-of-freedom correction; a kind with fewer than MIN_KIND_STEPS steps has none. Over
    every step of the window, outliers too: the fit leaves them out of its coefficients, but a
    prediction's band is the spread of step times a request meets."""
    out = {}
    for kind, mask in (("prefill", prefill), ("decode", ~prefill)):
        if int(mask.sum()) >= MIN_KIND_STEPS:
            e = resid[mask]
            out[kind] = float(math.sqrt(float(e @ e) / mask.sum() * resid.size / dof))
    return out


def _robust_scale(resid: np.ndarray) -> float:
    """1.4826 x the median absolute deviation: the residuals' SD were they normal, unmoved by
    a few outliers."""
    if resid.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(resid - np.median(resid))))


def _outlier(resid_ns: float, predicted_ns: float, scale_ns: float) -> bool:
    """A step far slower than the fit: OUTLIER_SCALES robust SDs and OUTLIER_FRACTION of
    its predicted time above it. Both, so that a GPU's steady decodes (a tiny scale) do not
    make a chunk that the linear model fits a few percent off into an outlier."""
    return resid_ns > max(OUTLIER_SCALES * scale_ns, OUTLIER_FRACTION * max(predicted_ns, 0.0))


def _autocorrelation(resid: np.ndarray, steps: np.ndarray, n: int) -> tuple[float, ...]:
    """rho_j for j = 1..min(MAX_LAG, n // 4): the residuals of steps exactly j apart (steps
    left out of the window break no pair), correlated against the residuals' variance;
    negative values (and lags with too few pairs) count as 0."""
    var = float(resid @ resid) / resid.size
    if var <= 0:
        return ()
    where = {int(s): i for i, s in enumerate(steps)}
    out = []
    for lag in range(1, min(MAX_LAG, n // 4) + 1):
        pairs = [(i, where[s + lag]) for s, i in where.items() if s + lag in where]
        if len(pairs) < 4:
            out.append(0.0)
            continue
        a = np.array([resid[i] for i, _ in pairs])
        b = np.array([resid[j] for _, j in pairs])
        out.append(max(float(np.mean(a * b)) / var, 0.0))
    return tuple(out)


@dataclass(slots=True, frozen=True)
class StepSplit:
    """One step's measured time split between its decode tokens and its prefill tokens."""

    step: int
    kind: StepKind
    time_ns: int
    decode_ns: float
    prefill_ns: float


def split_steps(fit: TaxFit, records: Sequence[StepRecord]) -> list[StepSplit]:
    """Each timed step's measured time, split in the proportion of the model's decode and
    prefill parts (a decode-only step is all decode, a prefill-only step all prefill)."""
    out = []
    for s in timed_steps(records, fit.source):
        if s.prefill_tokens == 0:
            share = 0.0
        elif s.decode_tokens == 0:
            share = 1.0
        else:
            dp, pp = max(fit.decode_part_ns(s), 0.0), max(fit.prefill_part_ns(s), 0.0)
            share = pp / (dp + pp) if dp + pp > 0 else 0.0
        out.append(StepSplit(s.step, s.kind, s.time_ns, s.time_ns * (1 - share),
                             s.time_ns * share))
    return out


@dataclass(slots=True, frozen=True)
class ItlByKind:
    """ITL (ms) of the steps a running request waited through: decode-only steps beside steps
    that also carried a prefill chunk (mixed). Prefill-only steps carry no running request."""

    decode_only: Distribution
    with_prefill: Distribution


def itl_by_kind(records: Sequence[StepRecord], source: TimeSource = "period",
                window_steps: int = WINDOW_STEPS) -> ItlByKind:
    """p50/p99 of the step times of decode-only and of mixed steps, in ms."""
    steps = timed_steps(records, source)[-window_steps:]
    return ItlByKind(
        distribution([s.time_ns / 1e6 for s in steps if s.kind == "decode-only"]),
        distribution([s.time_ns / 1e6 for s in steps if s.kind == "mixed"]))


@dataclass(slots=True, frozen=True)
class DeviceShares:
    """Fractions of the window's device time (the compute lane) on decode, on prefill, idle:
    they add up to 1. ``window_ns`` is the window's length."""

    decode: float
    prefill: float
    idle: float
    window_ns: int


def device_shares(fit: TaxFit | None, records: Sequence[StepRecord],
                  window_steps: int = WINDOW_STEPS) -> DeviceShares | None:
    """The compute lane's busy time over the window of the last ``window_steps`` steps (first
    span to last end), each step's compute span split as its time is (split_steps; with no fit,
    a step carrying prefill tokens cannot be split and counts by its kind only when it is
    prefill-only or decode-only). None with no compute span in the window."""
    recs = sorted((r for r in records if r.spans), key=lambda r: r.step)[-window_steps:]
    if not recs:
        return None
    lo = min(s.start_ns for r in recs for s in r.spans)
    hi = max(r.end_ns or lo for r in recs)
    if hi <= lo:
        return None
    spans = [s for r in recs for s in r.spans if s.lane == "compute"]
    starts, ends = busy_intervals(spans, lo, hi)
    busy = int(np.sum(ends - starts))
    if busy == 0:
        return None
    pre = 0.0
    for r in recs:
        c = _compute_ns(r)
        if r.prefill_tokens == 0 or c == 0:
            continue
        if r.decode_tokens == 0:
            pre += c
        elif fit is not None:
            dc, pc = context_tokens(r)
            s = TimedStep(r.step, "mixed", c, r.decode_tokens, r.prefill_tokens, dc, pc)
            dp, pp = max(fit.decode_part_ns(s), 0.0), max(fit.prefill_part_ns(s), 0.0)
            pre += c * (pp / (dp + pp) if dp + pp > 0 else 0.0)
    total = sum(_compute_ns(r) for r in recs)
    prefill = busy / (hi - lo) * (pre / total if total else 0.0)
    busy_frac = busy / (hi - lo)
    return DeviceShares(busy_frac - prefill, prefill, 1.0 - busy_frac, hi - lo)


@dataclass(slots=True, frozen=True)
class PrefillTax:
    """The prefill tax of one window: the fit (or why none), what 1,000 prefill tokens add to
    every running request's ITL (ms, with its 95% interval; None with the reason), the ITL by
    step kind and the device-time shares."""

    fit: TaxFit | NoFit
    per_1k_ms: Interval | None
    per_1k_reason: str
    itl: ItlByKind
    shares: DeviceShares | None
    window_steps: int


def prefill_tax(records: Sequence[StepRecord], *, window_steps: int = WINDOW_STEPS,
                source: TimeSource = "period") -> PrefillTax:
    """Every prefill-tax figure of the last ``window_steps`` steps of ``records``."""
    fit = fit_step_time(records, window_steps=window_steps, source=source)
    per_1k, reason = None, ""
    if isinstance(fit, NoFit):
        reason = fit.reason
    elif not fit.has("prefill"):
        reason = fit.left_out.get("prefill", "the prefill term was not fitted")
    else:
        b = fit.coefficient("prefill")
        assert b is not None
        per_1k = Interval(b.estimate * 1e3 / 1e6, b.lo * 1e3 / 1e6, b.hi * 1e3 / 1e6, b.method)
    return PrefillTax(fit=fit, per_1k_ms=per_1k, per_1k_reason=reason,
                      itl=itl_by_kind(records, source, window_steps),
                      shares=device_shares(fit if isinstance(fit, TaxFit) else None, records,
                                           window_steps),
                      window_steps=window_steps)


# ----------------------------------------------------------------------------- what-if
@dataclass(slots=True, frozen=True)
class BudgetPrediction:
    """The predicted p99 ITL (ms) and throughput (tokens/s) at one token budget; ``note`` says
    what limits the prediction (empty when nothing does)."""

    budget: int
    p99_itl_ms: float
    tokens_per_s: float
    note: str = ""


@dataclass(slots=True, frozen=True)
class Demand:
    """What the window asks of the engine: the running decode batch (mean decode tokens of its
    steps carrying any), their summed context, the prefill demand (prefill tokens per second
    of the window) and the mean prompt (prefill tokens per request seen prefilling)."""

    decode_tokens: float
    decode_context: float
    prefill_per_s: float
    prompt_tokens: float


def demand(records: Sequence[StepRecord], window_steps: int = WINDOW_STEPS) -> Demand | None:
    """The window's demand, or None without timed steps."""
    recs = sorted((r for r in records if r.spans), key=lambda r: r.step)[-window_steps:]
    if len(recs) < 2:
        return None
    lo = min(s.start_ns for r in recs for s in r.spans)
    hi = max(r.end_ns or lo for r in recs)
    if hi <= lo:
        return None
    dec = [r for r in recs if r.decode_tokens > 0]
    d = float(np.mean([r.decode_tokens for r in dec])) if dec else 0.0
    dctx = float(np.mean([context_tokens(r)[0] for r in dec])) if dec else 0.0
    prefill = sum(r.prefill_tokens for r in recs)
    per_req: dict[str, int] = {}
    for r in recs:
        ones_left = r.decode_tokens
        for rid, n, _ in r.chunks:
            if n == 1 and ones_left > 0:
                ones_left -= 1
                continue
            per_req[rid] = per_req.get(rid, 0) + int(n)
    prompt = float(np.mean(list(per_req.values()))) if per_req else float(prefill)
    return Demand(d, dctx, prefill * 1e9 / (hi - lo), prompt)


def _quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = np.cumsum(w) / w.sum()
    return float(v[min(int(np.searchsorted(cum, q)), v.size - 1)])


def what_if(fit: TaxFit, records: Sequence[StepRecord],
            budgets: Sequence[int]) -> list[BudgetPrediction]:
    """Predicted p99 ITL and throughput at each token budget (max_num_batched_tokens), from the
    fit and the window's demand (``demand(records)``).

    The model: the running decodes (d tokens a step at their mean context) go first in every
    step, as the scheduler puts them; a prompt of P tokens (the window's mean) is then cut
    into k = ceil(P / c) chunks of at most c = budget - d tokens, and the ITL of a step that
    carries a chunk is the fit at that chunk (d decode tokens, P / k prefill tokens, the decode
    context plus the chunk's share of the prompt's P(P+1)/2 context tokens). Decode-only steps
    take the fit at (d, 0, decode context). To serve the window's prefill demand (lambda
    tokens/s) a second holds lambda / P * k chunk steps and decode-only steps in the rest; the
    p99 ITL is the 99th percentile of that mix of step times, each spread by the fit's own
    residuals. Throughput is the tokens those steps carry a second. A budget whose chunk steps
    would fill every second cannot keep up with the demand: the prediction is then all chunk
    steps (the queue grows), and the note says so. A budget at or below the decode batch leaves
    no room for a prefill (note). With no prefill term in the fit, the chunk steps cannot be
    predicted: every budget gets the decode-only figures and a note saying why.
    """
    bad = [b for b in budgets if not isinstance(b, int) or isinstance(b, bool) or b < 1]
    if bad:
        raise ValueError(f"budgets must be positive integers, got {bad}")
    dem = demand(records)
    if dem is None:
        raise ValueError("what_if needs a window of at least two timed steps")
    d, dctx = dem.decode_tokens, dem.decode_context
    resid = np.asarray(fit.residuals_ns, dtype=float)
    t0 = max(fit.mean_ns(d, 0.0, dctx), 1.0)
    out = []
    for budget in budgets:
        note = ""
        room = budget - d
        if dem.prefill_per_s <= 0 or dem.prompt_tokens <= 0:
            n1, t1, chunk = 0.0, t0, 0.0
            note = "no prefill in the window: decode-only steps at every budget"
        elif not fit.has("prefill"):
            n1, t1, chunk = 0.0, t0, 0.0
            note = fit.left_out.get("prefill", "the prefill term was not fitted") \
                + "; decode-only figures"
        elif room < 1:
            n1, t1, chunk = 0.0, t0, 0.0
            note = f"budget {budget} leaves no room beside {d:.0f} decode tokens: no prefill runs"
        else:
            prompt = dem.prompt_tokens
            k = math.ceil(prompt / room)
            chunk = prompt / k
            ctx = dctx + prompt * (prompt + 1) / 2 / k
            t1 = max(fit.mean_ns(d, chunk, ctx), 1.0)
            n1 = dem.prefill_per_s / chunk  # chunk steps a second
            if n1 * t1 >= 1e9:
                n1 = 1e9 / t1
                note = "prefill demand exceeds what this budget serves: every step carries a " \
                       "chunk and the queue grows"
        n0 = max(1e9 - n1 * t1, 0.0) / t0  # decode-only steps a second
        if d <= 0:  # nobody waits between tokens
            p99 = float("nan")
        else:
            base = resid if resid.size else np.zeros(1)
            vals = np.concatenate([t0 + base, t1 + base])
            w = np.concatenate([np.full(base.size, n0), np.full(base.size, n1)])
            p99 = _quantile(vals, w, 0.99) / 1e6 if w.sum() > 0 else t0 / 1e6
        tps = n0 * d + n1 * (d + chunk)
        out.append(BudgetPrediction(int(budget), float(p99), float(tps), note))
    return out
