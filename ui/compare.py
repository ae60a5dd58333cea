"""Is a difference between two modes real? Medians, spreads and a plain-words verdict.

Owns the one rule the Benchmark and A/B views use: each side is a few repeated measurements
(runs, or sub-windows of a capture); a side is summarised by its median and its spread
(lowest to highest); when the two spreads overlap the difference is not established. It
is called "no measurable difference" only when the medians also differ by less than
NEGLIGIBLE_PCT; a larger difference inside overlapping spreads is "not settled by these
runs" (a 41% difference must never read as no difference). Pure functions: no streamlit,
no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NEGLIGIBLE_PCT = 2.0  # medians closer than this, with overlapping spreads: no difference


@dataclass(slots=True, frozen=True)
class Spread:
    """Median and range of repeated measurements of one figure."""

    median: float
    lo: float
    hi: float
    n: int


def spread(values: Sequence[float]) -> Spread:
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        raise ValueError("spread needs at least one finite value")
    return Spread(float(np.median(arr)), float(arr.min()), float(arr.max()), int(arr.size))


@dataclass(slots=True, frozen=True)
class Verdict:
    measurable: bool
    change_pct: float  # (b - a) / a in percent, medians
    text: str


def verdict(
    a: Spread,
    b: Spread,
    *,
    a_label: str,
    b_label: str,
    what: str,
    unit: str = "",
    fmt: str = ",.2f",
    higher_is_better: bool = True,
) -> Verdict:
    """Compare ``b`` with ``a``: measurable only when the spreads do not overlap and each
    side has at least two measurements (a single run has no spread to judge by)."""
    change = 100.0 * (b.median / a.median - 1.0) if a.median else float("nan")
    ranges = (
        f"{a_label} {a.median:{fmt}}{unit} ({a.lo:{fmt}}-{a.hi:{fmt}}), "
        f"{b_label} {b.median:{fmt}}{unit} ({b.lo:{fmt}}-{b.hi:{fmt}})"
    )
    if a.n < 2 or b.n < 2:
        return Verdict(False, change, f"{what}: one measurement per side, no spread to judge "
                       f"by; repeat to tell ({ranges}).")
    if a.hi < b.lo or b.hi < a.lo:
        better = (b.median > a.median) == higher_is_better
        word = "better" if better else "worse"
        return Verdict(
            True,
            change,
            f"{what}: {b_label} is {abs(change):.1f}% {word} than {a_label} "
            f"({'higher' if change > 0 else 'lower'}), outside the spread of "
            f"{a.n} and {b.n} measurements: {ranges}.",
        )
    if abs(change) < NEGLIGIBLE_PCT:
        return Verdict(
            False,
            change,
            f"{what}: **no measurable difference** between {a_label} and {b_label} "
            f"(medians differ by {change:+.1f}%, inside the spread of {a.n} and {b.n} "
            f"measurements: {ranges}).",
        )
    return Verdict(
        False,
        change,
        f"{what}: **not settled by these runs**: the medians of {b_label} and {a_label} "
        f"differ by {change:+.1f}%, but the spreads of {a.n} and {b.n} measurements overlap "
        f"({ranges}). Repeat with more runs to tell.",
    )
