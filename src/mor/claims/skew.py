"""How skewed the seed noise is: the skewness of every comparison's per-seed differences.

The tests (``mor.stats``) stay valid under seed noise up to a pre-registered skew,
``design.skew`` (centred log-normal noise of either sign up to sigma, grids/claims/claims.yaml).
Whether the real differences are that skewed is measured here (issue 47): for each comparison
of each tested claim, the same K x n matrix of per-seed differences the verdict decides on
(``mor.claims.verdict._comparisons``: the pilot's seeds left out, the seeds past the last look
reached cut as the test cuts them), its sample skewness ``scipy.stats.skew(d, bias=False)``
(the adjusted Fisher-Pearson G1) and a BCa bootstrap interval for it
(``scipy.stats.bootstrap`` with a fixed generator, so the same runs give the same table), and
the log-normal sigma of that skewness, to read against the design's bound.

What this can and cannot show at n = 20: a sample that missed a skewed law's rare large values
shows little skew (the reason the tests assume a bound, docs/claims.md), so G1 is biased towards
0 and its bootstrap interval is too narrow for a skewed law; an interval that excludes 0 is
evidence of skew, one that covers 0 is not evidence of symmetry.

    python -m mor claims --results DIR [--analyses DIR] [--round plan.json ...] --out DIR --skew
                                          (skew.md and skew.csv beside claims.md)
"""

from __future__ import annotations

import math
import warnings
import numpy as np
import pandas as pd

from mor import stats
from mor.claims.registry import CLAIMS, Claim, Spec

LEVEL = 0.95  # the bootstrap interval's confidence level
RESAMPLES = 9999  # scipy's default; a 20-seed comparison takes ~0.1 s
SEED = 47  # the bootstrap's generator (issue 47): the same runs give the same intervals

COLUMNS = ["claim", "comparison", "metric", "n seeds", "mean", "sd", "skewness", "lo", "hi", "lognormal sigma",
           "sigma lo", "sigma hi", "per seed"]


def _g1(x, axis=-1):
    """The adjusted Fisher-Pearson skewness G1 (``scipy.stats.skew(bias=False)``); 0 for a constant sample."""
    from scipy import stats as st

    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy's precision-loss warning on a near-constant resample
        out = st.skew(x, axis=axis, bias=False)
    return np.where(np.isfinite(out), out, 0.0)


def skewness(d, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float, int]:
    """(G1, lo, hi, n) of one vector of per-seed differences: the sample skewness and its BCa
    bootstrap ``level`` interval (``scipy.stats.bootstrap``, ``resamples`` resamples from
    ``numpy.random.default_rng(seed)``); nan below 3 seeds (G1 needs 3), a nan interval for a
    constant vector (no spread: nothing to resample)."""
    from scipy import stats as st

    d = np.asarray([v for v in np.ravel(np.asarray(d, dtype=np.float64)) if math.isfinite(v)])
    n = len(d)
    if n < 3:
        return math.nan, math.nan, math.nan, n
    if np.ptp(d) == 0:
        return 0.0, math.nan, math.nan, n
    g = float(_g1(d))
    with np.errstate(invalid="ignore", divide="ignore"):
        res = st.bootstrap((d,), _g1, vectorized=True, n_resamples=resamples, confidence_level=level,
                           method="BCa", rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # BCa's acceleration undefined (a degenerate jackknife)
        with np.errstate(invalid="ignore", divide="ignore"):
            res = st.bootstrap((d,), _g1, vectorized=True, n_resamples=resamples, confidence_level=level,
                               method="percentile", rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return g, lo, hi, n


def lognormal_skewness(sigma: float) -> float:
    """The skewness of a log-normal(sigma) law, (e^{s^2} + 2) sqrt(e^{s^2} - 1): the shape the
    tests' bound ``design.skew`` names (sigma 0.4: 1.32, 0.6: 2.26, 0.8: 3.70)."""
    w = math.exp(sigma ** 2)
    return (w + 2) * math.sqrt(w - 1)


def lognormal_sigma(g: float) -> float:
    """The log-normal sigma whose skewness is |g| (signed like g; 0 for 0, nan for nan), to read a
    measured skewness against ``design.skew`` (``lognormal_skewness`` is increasing in sigma:
    one root)."""
    if not math.isfinite(g):
        return math.nan
    if g == 0:
        return 0.0
    from scipy.optimize import brentq

    hi = 1.0
    while lognormal_skewness(hi) < abs(g):
        hi *= 2
    return math.copysign(brentq(lambda s: lognormal_skewness(s) - abs(g), 0.0, hi, xtol=1e-10), g)


def skew_table(frames: dict[str, pd.DataFrame], design: stats.Design, specs: dict[str, Spec],
               family: tuple[str, ...] | None = None, claims: tuple[Claim, ...] = CLAIMS,
               resamples: int = RESAMPLES, seed: int = SEED,
               first_seeds: dict[tuple[str, str], int] | None = None) -> pd.DataFrame:
    """One row per comparison of every claim of ``family`` (None: every claim) whose grids are
    built and which has at least 3 seeds: its n, mean, sd, G1 with its bootstrap interval, and
    the log-normal sigma of G1 and of the interval's ends (compare with ``design.skew``). The
    differences are the ones the verdict reads (``verdict._comparisons``, the seeds the test's
    looks read; ``first_seeds`` as ``verdict.evaluate`` takes it)."""
    from mor.claims.verdict import _comparisons

    members = {c.id for c in claims} if family is None else set(family)
    rows, split = [], {}
    for c in claims:
        if c.id not in members or any(g not in frames for g in c.grids):
            continue
        m, labels, kept, _, metric = _comparisons(c, specs.get(c.id, Spec()), frames, design.first_seed, split, first_seeds)
        looks = design.looks_within(len(kept))
        m = m[:, :looks[-1]] if looks else m
        for k, label in enumerate(labels):
            d = m[k]
            g, lo, hi, n = skewness(d, resamples=resamples, seed=seed)
            if n < 3:
                continue
            rows.append({"claim": c.id, "comparison": label, "metric": metric[label], "n seeds": n,
                         "mean": float(d.mean()), "sd": float(d.std(ddof=1)), "skewness": g, "lo": lo, "hi": hi,
                         "lognormal sigma": lognormal_sigma(g), "sigma lo": lognormal_sigma(lo),
                         "sigma hi": lognormal_sigma(hi), "per seed": ", ".join(f"{e:.4g}" for e in d)})
    return pd.DataFrame(rows, columns=COLUMNS)


def skew_markdown(table: pd.DataFrame, design: stats.Design) -> str:
    """skew.md: the table and what its columns mean, beside claims.md."""
    bound = design.skew
    head = (f"# Skewness of every comparison's per-seed differences\n\n"
            f"The differences each verdict reads (claims.md; the pilot's seeds left out). 'skewness' is the adjusted "
            f"Fisher-Pearson G1 (scipy.stats.skew, bias=False); 'lo'/'hi' its {LEVEL:.0%} BCa bootstrap interval "
            f"(scipy.stats.bootstrap, {RESAMPLES} resamples, generator seed {SEED}); 'lognormal sigma' the log-normal "
            f"sigma with that skewness (signed), 'sigma lo/hi' those of the interval's ends. The tests are valid up to "
            f"log-normal sigma {bound:g} of either sign (design.skew; skewness {lognormal_skewness(bound):.2f})."
            f" At 20 seeds G1 is biased towards 0 for a skewed law and its bootstrap interval is too narrow: an "
            f"interval that excludes 0 is evidence of skew; one that covers 0 does not show symmetry.\n\n")
    if table.empty:
        return head + "No comparison with 3 or more seeds.\n"
    shown = table.drop(columns=["per seed"]).copy()
    for col in ("mean", "sd"):
        shown[col] = shown[col].map(lambda v: f"{v:.4g}")
    for col in ("skewness", "lo", "hi", "lognormal sigma", "sigma lo", "sigma hi"):
        shown[col] = shown[col].map(lambda v: "" if not math.isfinite(v) else f"{v:.2f}")
    near = np.minimum(table["sigma lo"].abs(), table["sigma hi"].abs())  # the interval's end nearest 0
    past = table[(near > bound) & (np.sign(table["sigma lo"]) == np.sign(table["sigma hi"]))]
    tail = (f"\n\n{len(past)} of {len(table)} comparisons have an interval wholly beyond the bound (sigma {bound:g}): "
            + (", ".join(f"{r['claim']} {r['comparison']}" for _, r in past.iterrows()) or "none") + ".\n")
    return head + shown.to_markdown(index=False) + tail
