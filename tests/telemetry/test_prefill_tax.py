"""The prefill tax on synthetic step records whose time follows a known cost model: the fit
recovers the model's coefficients within its stated intervals, degenerate windows say what
cannot be fitted instead of inventing it, and the split, the shares and the what-if follow."""

from __future__ import annotations

import math

import numpy as np
import pytest

from telemetry.prefill_tax import (
    NoFit,
    TaxFit,
    context_tokens,
    device_shares,
    fit_step_time,
    itl_by_kind,
    prefill_tax,
    split_steps,
    step_kind,
    timed_steps,
    what_if,
)
from telemetry.records import Span, StepRecord

# The cost model, ns: intercept + per decode token + per prefill token + per context token.
A, BD, BP, BC = 2_000_000.0, 150_000.0, 40_000.0, 30.0


def model_ns(d: int, p: int, c: int) -> float:
    return A + BD * d + BP * p + BC * c


def run(steps: list[tuple[list[int], tuple[int, int] | None]], noise_ns: float = 0.0,
        seed: int = 0, idle_before: dict[int, int] | None = None,
        cost=model_ns, carry: float = 0.0) -> list[StepRecord]:
    """Consecutive sync steps. Each is (decode contexts, prefill chunk (tokens, end) or None);
    its period follows ``cost`` plus Gaussian noise (``carry`` of each step's noise carried
    into the next: slow stretches); compute is 80% of it."""
    rng = np.random.default_rng(seed)
    t = 1_000_000_000
    out = []
    noise = 0.0
    for i, (dctx, chunk) in enumerate(steps):
        t += (idle_before or {}).get(i, 0)
        chunks = [(f"r{j}", 1, c) for j, c in enumerate(dctx)]
        p = 0
        if chunk is not None:
            chunks.append(("long", chunk[0], chunk[1]))
            p = chunk[0]
        rec = StepRecord(step=i, mode="sync", slot=0, num_requests=len(chunks),
                         prefill_tokens=p, decode_tokens=len(dctx), chunks=chunks)
        c = sum(context_tokens(rec))
        noise = carry * noise + math.sqrt(1 - carry**2) * rng.normal(0, noise_ns)
        dur = int(max(cost(len(dctx), p, c) + noise, 1e5))
        cut = t + dur // 10
        rec.spans = [Span("cpu.schedule", t, cut), Span("compute", cut, cut + dur * 8 // 10),
                     Span("cpu.post", cut + dur * 8 // 10, t + dur)]
        out.append(rec)
        t += dur
    return out


def varied_run(n: int = 300, seed: int = 1, noise_ns: float = 200_000.0,
               carry: float = 0.0) -> list[StepRecord]:
    """Streams come and go (1-12 decodes), prompts of varied lengths are chunked in."""
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(n):
        d = int(rng.integers(1, 13))
        dctx = [int(x) for x in rng.integers(20, 600, size=d)]
        chunk = None
        if rng.random() < 0.35:
            tokens = int(rng.integers(16, 512))
            chunk = (tokens, tokens + int(rng.integers(0, 1500)))
        steps.append((dctx, chunk))
    return run(steps, noise_ns=noise_ns, seed=seed, carry=carry)


def eight_streams_and_a_long_prompt(noise_ns: float = 150_000.0, seed: int = 2,
                                    cost=model_ns) -> list[StepRecord]:
    """Eight streams decode throughout (their contexts grow); prompts of several lengths
    arrive and are prefilled in chunks of at most 248 tokens."""
    steps = []
    ctx = [100 + 13 * j for j in range(8)]
    prompts = {20: 300, 60: 700, 110: 1200, 170: 2000}
    pending: list[list[int]] = []
    for i in range(240):
        if i in prompts:
            pending.append([prompts[i], 0])
        chunk = None
        if pending:
            total, done = pending[0]
            n = min(248, total - done)
            pending[0][1] += n
            chunk = (n, done + n)
            if pending[0][1] == total:
                pending.pop(0)
        steps.append((list(ctx), chunk))
        ctx = [c + 1 for c in ctx]
    return run(steps, noise_ns=noise_ns, seed=seed, cost=cost)


def test_step_kinds_and_contexts():
    rec = StepRecord(step=0, mode="sync", slot=0, num_requests=3, prefill_tokens=4,
                     decode_tokens=2, chunks=[("a", 1, 10), ("b", 1, 20), ("c", 4, 7)])
    assert step_kind(rec) == "mixed"
    # the chunk's four tokens attend to 4, 5, 6 and 7 positions
    assert context_tokens(rec) == (30, 4 + 5 + 6 + 7)
    assert step_kind(StepRecord(0, "sync", 0, 1, 0, 1)) == "decode-only"
    assert step_kind(StepRecord(0, "sync", 0, 1, 9, 0)) == "prefill-only"


def test_the_fit_recovers_a_known_cost_model_within_its_intervals():
    fit = fit_step_time(varied_run(), window_steps=300)
    assert isinstance(fit, TaxFit)
    assert fit.terms == ("decode", "prefill", "context") and not fit.left_out
    for term, true in (("intercept", A), ("decode", BD), ("prefill", BP), ("context", BC)):
        ci = fit.coefficient(term)
        assert ci is not None and ci.lo <= true <= ci.hi, (term, ci, true)
        assert ci.hi - ci.lo < 0.25 * true  # the interval is informative
    assert 150_000 < fit.rmse_ns < 250_000  # the noise put in: 200 us
    tax = prefill_tax(varied_run(), window_steps=300)
    assert tax.per_1k_ms is not None
    assert tax.per_1k_ms.lo <= BP * 1e3 / 1e6 <= tax.per_1k_ms.hi


def test_the_prediction_interval_covers_new_steps_at_its_stated_rate():
    fit = fit_step_time(varied_run(seed=3), window_steps=300)
    assert isinstance(fit, TaxFit)
    fresh = timed_steps(varied_run(seed=4))
    preds = [(fit.predict(s.decode_tokens, s.prefill_tokens, s.context), s) for s in fresh]
    inside = [p.lo_ns <= s.time_ns <= p.hi_ns for p, s in preds]
    assert 0.9 <= np.mean(inside) <= 0.99


def test_slow_stretches_widen_the_interval_of_consecutive_steps_to_cover_them():
    """Noise that carries from step to step (a shared machine's slow stretches): the fit sees
    it in its residuals, and its interval for a run of 4 consecutive new steps covers them at
    about its stated rate, where the interval of 4 independent steps would not."""
    fit = fit_step_time(varied_run(n=400, seed=5, carry=0.8), window_steps=400)
    assert isinstance(fit, TaxFit) and fit.rho[0] > 0.5 and fit.inflation > 2
    fresh = timed_steps(varied_run(n=800, seed=6, carry=0.8))
    ours = naive = 0
    blocks = [fresh[i:i + 4] for i in range(0, len(fresh) - 3, 4)]
    for block in blocks:
        y = np.mean([s.time_ns for s in block])
        p = fit.predict_steps(block)
        ours += p.lo_ns <= y <= p.hi_ns
        q = fit.predict(np.mean([s.decode_tokens for s in block]),
                        np.mean([s.prefill_tokens for s in block]),
                        np.mean([s.context for s in block]), k=4)
        naive += q.lo_ns <= y <= q.hi_ns
    assert ours / len(blocks) >= 0.88 and naive / len(blocks) < ours / len(blocks) - 0.08


def test_eight_constant_streams_fold_decode_into_the_intercept_and_still_fit_prefill():
    recs = eight_streams_and_a_long_prompt()
    fit = fit_step_time(recs)
    assert isinstance(fit, TaxFit)
    assert "decode" not in fit.terms and "always 8" in fit.left_out["decode"]
    ci = fit.coefficient("prefill")
    assert ci is not None and ci.lo <= BP <= ci.hi
    # the long prompt's chunk steps: the mean of them lies in the fit's interval for a mean
    long = [s for s in timed_steps(recs) if s.prefill_tokens > 0][-8:]
    pred = fit.predict_steps(long)
    assert pred.lo_ns <= np.mean([s.time_ns for s in long]) <= pred.hi_ns


def test_a_fit_without_the_prefill_term_mispredicts_the_chunk_steps():
    """The control the engine test relies on: a fit that knows nothing of the chunks (a step
    time from throughput: the intercept alone) puts the mean of the long prompt's chunk steps
    outside its own interval."""
    recs = eight_streams_and_a_long_prompt()
    long = [s for s in timed_steps(recs) if s.prefill_tokens > 0][-8:]
    measured = np.mean([s.time_ns for s in long])
    flat = fit_step_time(recs, terms=("decode",))
    assert isinstance(flat, TaxFit) and flat.terms == ()
    pred = flat.predict_steps(long)
    assert measured > pred.hi_ns


def test_no_prefill_in_the_window_says_the_prefill_term_cannot_be_fitted():
    recs = run([([100 + i] * (1 + i % 5), None) for i in range(60)], noise_ns=50_000)
    tax = prefill_tax(recs)
    assert isinstance(tax.fit, TaxFit) and not tax.fit.has("prefill")
    assert tax.per_1k_ms is None and "cannot be fitted" in tax.per_1k_reason
    assert tax.itl.with_prefill.count == 0 and tax.itl.decode_only.count == 59
    preds = what_if(tax.fit, recs, [64, 512])
    assert all("no prefill" in p.note for p in preds)
    assert preds[0].p99_itl_ms == preds[1].p99_itl_ms


def test_too_few_steps_fit_nothing_and_say_why():
    fit = fit_step_time(run([([50], (30, 30))] * 4))
    assert isinstance(fit, NoFit) and "needs" in fit.reason and fit.steps == 3
    tax = prefill_tax(run([([50], None)] * 3))
    assert isinstance(tax.fit, NoFit) and tax.per_1k_ms is None and tax.per_1k_reason


def test_bad_arguments_are_refused_with_what_is_allowed():
    recs = varied_run(n=40)
    with pytest.raises(ValueError, match="window_steps"):
        fit_step_time(recs, window_steps=0)
    with pytest.raises(ValueError, match="terms must be among"):
        fit_step_time(recs, terms=("prefil",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source must be"):
        timed_steps(recs, source="wall")  # type: ignore[arg-type]
    fit = fit_step_time(recs)
    assert isinstance(fit, TaxFit)
    with pytest.raises(ValueError, match="positive integers"):
        what_if(fit, recs, [256, 0])


def test_an_idle_wait_before_a_step_is_not_its_time():
    recs = run([([100], None)] * 10, idle_before={5: 3_000_000_000})
    times = {s.step: s.time_ns for s in timed_steps(recs)}
    assert 0 not in times  # no previous step, no period
    assert times[5] == pytest.approx(model_ns(1, 0, 100), rel=1e-6)


def test_split_adds_up_and_gives_a_chunk_its_share():
    recs = eight_streams_and_a_long_prompt(noise_ns=0.0)
    fit = fit_step_time(recs)
    assert isinstance(fit, TaxFit)
    for sp in split_steps(fit, recs):
        assert sp.decode_ns + sp.prefill_ns == pytest.approx(sp.time_ns)
        if sp.kind == "decode-only":
            assert sp.prefill_ns == 0
    steps = {s.step: s for s in timed_steps(recs)}
    mixed = [sp for sp in split_steps(fit, recs) if sp.kind == "mixed"]
    for sp in mixed:
        s = steps[sp.step]
        assert sp.prefill_ns == pytest.approx(BP * s.prefill_tokens + BC * s.prefill_context,
                                              rel=1e-3)


def test_itl_by_kind_and_device_shares():
    recs = eight_streams_and_a_long_prompt(noise_ns=0.0)
    itl = itl_by_kind(recs)
    assert itl.with_prefill.count > 0 and itl.with_prefill.p50 > itl.decode_only.p99
    fit = fit_step_time(recs)
    shares = device_shares(fit if isinstance(fit, TaxFit) else None, recs)
    assert shares is not None
    assert shares.decode + shares.prefill + shares.idle == pytest.approx(1.0)
    assert shares.idle == pytest.approx(0.2, abs=0.01)  # compute is 80% of every step
    assert 0.05 < shares.prefill < shares.decode


def test_what_if_a_larger_budget_raises_p99_itl_and_drains_a_saturated_queue():
    recs = eight_streams_and_a_long_prompt(noise_ns=50_000)
    fit = fit_step_time(recs)
    assert isinstance(fit, TaxFit)
    preds = what_if(fit, recs, [8, 24, 64, 256, 1024])
    by = {p.budget: p for p in preds}
    assert "no room" in by[8].note
    assert "queue grows" in by[24].note
    assert by[64].p99_itl_ms < by[256].p99_itl_ms < by[1024].p99_itl_ms
    # a chunk of 248 tokens (the window's own budget) predicts its own chunk steps
    chunk_ms = fit.mean_ns(8, 248, 8 * 200 + 248 * 124) / 1e6
    assert by[256].p99_itl_ms > 0.8 * chunk_ms
    assert by[24].tokens_per_s < by[256].tokens_per_s
    assert all(math.isfinite(p.tokens_per_s) for p in preds)


def test_a_step_left_out_still_times_the_step_after_it():
    """In async mode a step starts (its scheduling) while the one before it computes; a fit
    that leaves that one out (``exclude``) times the next from its end, as a request riding
    both waited, where fitting the records without it would add most of it to the next."""
    recs = varied_run()
    out = set(range(10, len(recs) - 1, 7))
    for i in out:
        cur, nxt = recs[i], recs[i + 1]
        assert cur.end_ns is not None
        start = cur.spans[0].start_ns + (cur.end_ns - cur.spans[0].start_ns) // 3
        nxt.spans[0] = Span(nxt.spans[0].lane, start, nxt.spans[0].end_ns)
    good = fit_step_time(recs, window_steps=len(recs), exclude=out)
    bad = fit_step_time([r for r in recs if r.step not in out], window_steps=len(recs))
    assert isinstance(good, TaxFit) and isinstance(bad, TaxFit)
    assert good.steps == len(recs) - 1 - len(out) and not good.outliers
    assert good.rmse_ns < 1.5 * 200_000.0  # the runs' noise
    assert bad.rmse_ns > 2 * good.rmse_ns, (bad.rmse_ns, good.rmse_ns)
