"""The statistics behind the claims table, as pure functions of per-seed effects.

A claim is decided from one or more *comparisons*, each a vector of per-seed differences
(seed s uses only the runs of seed s, so the seeds are independent replicates). The last
axis of every array below is the seed axis, so the same functions run one claim or, in the
tests, thousands of simulated families at once.

Tests (t statistics on the per-seed differences; each one-sided p-value the largest over Student's t
and the skewed noise shapes the design allows, ``design.skew``: see "Skew" below):

* **superiority** ("A beats B", "A is best"): every comparison must point the paper's way.
  "A is best" holds only if A beats *every* competitor: an intersection-union test (Berger
  1982), which needs no multiplicity correction: p_hold = max_k p_k(mu_k <= 0). It is
  contradicted if *some* competitor beats A: a union, Bonferroni over the K comparisons:
  p_contra = K min_k p_k(mu_k >= 0). Both one-sided p-values are doubled, so with K = 1
  the claim holds at level alpha exactly when the two-sided 1 - alpha interval lies above 0.
* **equivalence** ("X changes NLL little"): two one-sided tests (TOST, Schuirmann 1987)
  per comparison, p_k = max(p(mu_k <= -m), p(mu_k >= m)); it holds when every comparison
  is inside +-m (intersection-union again; with K = 1 and alpha = 0.05 this is "the 90%
  interval lies inside +-m"). It is contradicted when some comparison lies outside the
  margin: Bonferroni over K and over the two sides.

Sequential looks: seeds are added in pre-registered looks (``Design.looks``, e.g. n = 3, 6,
9). The level alpha is spent over the looks with a Lan-DeMets spending function of the
power family, alpha(t) = alpha t^rho with t = n / n_max (Lan & DeMets 1983; Kim & DeMets
1987; rho = 1 spends evenly, like Pocock; rho = 3 resembles O'Brien-Fleming). Look k is
tested at its increment alpha w_k, and the claim's sequential p-value is
min_k p_k / w_k (a weighted Bonferroni over the looks). Why not the exact group-sequential
boundaries: those assume a normal statistic with known variance, and at 3 seeds the t
statistic has 2 degrees of freedom, far from normal. The union bound needs no distributional
link between looks, so it is valid with t tests at any n, at the price of some power (the
exact boundaries would be a little lower). Why not an anytime-valid confidence sequence
(Howard et al. 2021): those need a known bound or sub-Gaussian scale for the effect, which
we do not have across NLL, MaxVio and throughput claims, and they are wider than a t
interval at n <= 10.

Across claims: Holm's step-down (Holm 1979) over the sequential p-values of a family fixed
in advance (mor.claims: every claim whose grids are built; one below the first look counts
with p = 1). Holm is monotone (smaller p-values never undo a rejection), and stopping a
claim early only removes looks (its p-value can only be larger than if it had run all
looks), so stopping every decided claim and adding seeds only to the undecided ones keeps
the family-wise error rate at alpha. Holm is written out here (six lines) because
statsmodels is not in the environment; ``tests/unit/test_stats.py`` checks it, and every other
function, on simulated null and planted effects.

Minimum detectable effect (MDE): the common true mean of every comparison that n seeds find
with probability ``power`` at the level the claim faces (an intersection-union claim needs all
of them to pass; ``power_iut``). Each comparison's power is that of the test as it decides:
its t past the test's critical value (``critical_t``, read off the same tables as the
p-values), the least over the noise shapes the test allows (the exact noncentral t for normal
noise, each log-normal shape of either sign from its tabulated draws). So the MDE, the seeds a
paper effect needs and the planner's chance that a look decides (``chance_decides``) are the
skewed test's, not Student's: at n = 20, level 0.01, the MDE is 1.31 sd, Student's 0.84. The
earlier fixed-n formula (t_{1-level/2} + t_power) sd / sqrt(n) understated it (true power
0.66-0.75 at n = 3-9 for a stated 0.8) and read only the binding comparison.

Variance floor: each comparison's seed sd is floored at its metric's resolution
(grids/claims/claims.yaml ``design.resolution``, each with its reason), so a deterministic or
rounded quantity (a dead-token ratio of 0 in every seed) never becomes certainty.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np


class _SciPyStats:
    """``scipy.stats``, imported on first use: the claims registry (and through it every
    Snakemake parse, the report's captions and ``mor.launch plan``) imports this module for
    ``Design``, and scipy's import alone cost ~1 s of each of those."""

    def __getattr__(self, name):
        from scipy import stats

        return getattr(stats, name)


_st = _SciPyStats()


# --------------------------------------------------------------------------------------
# One-sample t tests along the last axis
# --------------------------------------------------------------------------------------
def _t(x: np.ndarray, mu0: float, floor=0.0) -> tuple[np.ndarray, np.ndarray]:
    """t statistic of H0: mean = mu0 and its degrees of freedom, along the last axis. The
    seeds' sd is floored at ``floor`` (the metric's resolution, broadcast over the leading
    axes): a spread below what the metric can resolve is not evidence of certainty, so a
    constant vector gives the t of its mean against the resolution, never an infinite one."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n < 2:
        raise ValueError(f"a t test needs >= 2 seeds, got {n}")
    sd = np.maximum(x.std(axis=-1, ddof=1), np.asarray(floor, dtype=np.float64))
    se = np.where(sd > 0, sd, np.nan) / math.sqrt(n)
    t = (x.mean(axis=-1) - mu0) / se
    return np.where(np.isnan(t), 0.0, t), n - 1  # sd = 0 with no floor: no evidence either way


# Skew. A t statistic on n skewed differences has a lopsided null law: with right-skewed
# differences a sample that misses the rare large values has a low mean *and* a small sd, so t
# falls in its lower tail far more often than Student's t says (n = 20, log-normal sigma 0.8:
# P(t <= t_{19, 0.001}) = 0.007). No data-driven correction fixes this at n = 20 in the tails the
# claims use (0.001 a comparison): Johnson's and Hall's skew-corrected t halve the excess, a
# bootstrap-t (2,000 studentised resamples) leaves 3-8x, and a sign-flip permutation test
# assumes the symmetry that is missing (docs/claims.md, "Skewed seed noise"): a sample that
# missed the tail does not show its skew. So the p-value is the
# largest over a pre-registered set of noise shapes (design.skew): Student's t (normal noise)
# and centred log-normal noise exp(sigma Z) of either sign for sigma up to ``skew``. t does not
# depend on the noise's location or scale, so its null law under each shape is one fixed
# distribution a simulation tabulates once (``_skew_table``); the p-value is valid for every
# shape in the set (the least favourable of them), and conservative for the others.
_SKEW_GRID = (0.2, 0.4, 0.6, 0.8, 1.0)  # log-normal shapes tabulated, up to the largest skew asked for
_SKEW_DRAWS = 200_000  # per shape and n: the tail at p = 0.001 rests on ~200 draws


@functools.lru_cache(maxsize=16)
def _skew_draws(n: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(centred mean, sd) of each of _SKEW_DRAWS samples of n right-skewed log-normal(sigma)
    values exp(sigma Z), from a fixed generator (the same draws in every process): their t
    statistics are the null law ``_skew_table`` sorts, and the power of the same test under the
    same shape reads them too (``_shape_u``)."""
    rng = np.random.default_rng([47, n, int(round(sigma * 1000))])
    m, s = np.empty(_SKEW_DRAWS), np.empty(_SKEW_DRAWS)
    step = max(1, 4_000_000 // n)  # draws per chunk: ~32 MB of float64 at a time
    for i in range(0, _SKEW_DRAWS, step):
        x = np.exp(sigma * rng.standard_normal((min(step, _SKEW_DRAWS - i), n)))  # (draws, n)
        m[i:i + len(x)] = x.mean(axis=1) - math.exp(sigma ** 2 / 2)
        s[i:i + len(x)] = x.std(axis=1, ddof=1)
    return m, s


@functools.lru_cache(maxsize=None)
def _skew_table(n: int, sigma: float) -> np.ndarray:
    """The sorted null t statistics of n centred right-skewed log-normal(sigma) differences,
    _SKEW_DRAWS of them (``_skew_draws``: the same table, so the same verdicts, in every process)."""
    m, s = _skew_draws(n, sigma)
    out = m / (s / math.sqrt(n))
    out.sort()
    return out


def _shapes(skew: float) -> list[float]:
    """The log-normal sigmas a p-value with bound ``skew`` is the largest over (each of either sign)."""
    return [s for s in _SKEW_GRID if s < skew] + [float(skew)] if skew else []


def _cdf_t(t: np.ndarray, dof: int, skew: float) -> np.ndarray:
    """P(T <= t) under the least favourable null shape: the largest over Student's t and the
    log-normal shapes of either sign up to sigma ``skew`` (0: Student's t alone). A right-skewed
    shape's lower tail is its table's share at or below t, counted as (k + 1) / (draws + 1) so
    that the far tail is never 0; a left-skewed shape is its mirror, 1 - P_right(T < -t)."""
    out = np.asarray(_st.t.cdf(t, dof), dtype=np.float64)
    if not skew:
        return out
    if skew > _SKEW_GRID[-1]:
        raise ValueError(f"skew (log-normal sigma) is tabulated up to {_SKEW_GRID[-1]}, got {skew}")
    draws = _SKEW_DRAWS + 1.0
    for sigma in _shapes(skew):
        table = _skew_table(dof + 1, sigma)
        right = (np.searchsorted(table, t, side="right") + 1) / draws
        left = 1 - np.searchsorted(table, -t, side="left") / draws
        out = np.maximum(out, np.minimum(np.maximum(right, left), 1.0))
    return out


def p_above(x: np.ndarray, mu0: float = 0.0, floor=0.0, skew: float = 0.0) -> np.ndarray:
    """One-sided p-value of H0: mean <= mu0 (small when the mean is above mu0); ``skew``: the
    largest log-normal sigma of the noise shapes it stays valid for (0: Student's t)."""
    t, dof = _t(x, mu0, floor)
    return _cdf_t(-t, dof, skew)  # the shapes come in mirror pairs, so P(T >= t) = cdf(-t)


def p_below(x: np.ndarray, mu0: float = 0.0, floor=0.0, skew: float = 0.0) -> np.ndarray:
    """One-sided p-value of H0: mean >= mu0 (small when the mean is below mu0); ``skew`` as in
    ``p_above``."""
    t, dof = _t(x, mu0, floor)
    return _cdf_t(t, dof, skew)


def interval(x, level: float = 0.95, floor: float = 0.0, skew: float = 0.0) -> tuple[float, float, float, int]:
    """Mean and two-sided ``level`` interval (lo, hi) of one vector, and n (nan interval
    for n < 2). ``floor``: the sd floor the tests apply (``_t``); ``skew``: the noise shapes
    the tests hold under (``critical_t``: the shapes come in both signs, so one critical value
    serves both ends). So the interval shown is the one the test decided on: with K = 1 it
    lies above 0 exactly when the one-sided p at (1 - level) / 2 rejects."""
    x = np.asarray([v for v in np.ravel(np.asarray(x, dtype=np.float64)) if math.isfinite(v)])
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = critical_t((1 - level) / 2, n - 1, skew) * max(float(x.std(ddof=1)), float(floor)) / math.sqrt(n)
    return mean, mean - half, mean + half, n


# --------------------------------------------------------------------------------------
# A claim's two p-values: "holds" and "contradicted"
# --------------------------------------------------------------------------------------
def superiority_p(e: np.ndarray, floor=0.0, skew: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(p_hold, p_contra) of "every comparison > 0", from e of shape (..., K, n): K
    comparisons, n seeds (module docstring: intersection-union, Bonferroni for the union).
    ``floor``: each comparison's sd floor (scalar or shape (K,)); ``skew``: the noise shapes
    each one-sided p holds under (``p_below``; Bonferroni and the intersection-union need no
    more than valid p-values per comparison, so the combination holds under them too)."""
    e = np.asarray(e, dtype=np.float64)
    k = e.shape[-2]
    p_hold = np.minimum(1.0, 2 * p_above(e, 0.0, floor, skew).max(axis=-1))
    p_contra = np.minimum(1.0, 2 * k * p_below(e, 0.0, floor, skew).min(axis=-1))
    return p_hold, p_contra


def equivalence_p(d: np.ndarray, margin: float, floor=0.0, skew: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(p_hold, p_contra) of "every |comparison| < margin" from signed differences d of shape
    (..., K, n): TOST per comparison, intersection-union over them; contradicted when some
    comparison lies outside +-margin (Bonferroni over K and the two sides)."""
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    d = np.asarray(d, dtype=np.float64)
    k = d.shape[-2]
    tost = np.maximum(p_above(d, -margin, floor, skew), p_below(d, margin, floor, skew))  # (..., K)
    outside = np.minimum(p_above(d, margin, floor, skew), p_below(d, -margin, floor, skew))
    return tost.max(axis=-1), np.minimum(1.0, 2 * k * outside.min(axis=-1))


def binding(c: np.ndarray, margin: float | None = None, floor=0.0) -> int:
    """The comparison (row of c, shape (K, n)) closest to failing the claim: the largest
    one-sided p of "> 0" (or TOST p with a margin), with the sd floor the test applies
    (``floor``: scalar or one per comparison); by mean when n < 2."""
    c = np.asarray(c, dtype=np.float64)
    if c.shape[-1] < 2:
        return int(np.argmax(np.abs(c.mean(axis=1)))) if margin else int(np.argmin(c.mean(axis=1)))
    if margin:
        return int(np.argmax(np.maximum(p_above(c, -margin, floor), p_below(c, margin, floor))))
    return int(np.argmax(p_above(c, 0.0, floor)))


# --------------------------------------------------------------------------------------
# Sequential looks
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Design:
    """A pre-registered sequential design (grids/claims.yaml ``design``)."""

    alpha: float = 0.05  # family-wise error rate over every claim decided with seeds
    looks: tuple[int, ...] = (3, 6, 9)  # seeds per claim at each look
    rho: float = 1.0  # power-family spending exponent, alpha(t) = alpha t^rho
    power: float = 0.8  # for the minimum detectable effect and the seeds needed
    floors: dict = field(default_factory=dict, hash=False)  # metric -> sd floor (its resolution)
    # seed offsets (train.seed minus its block's first seed, as mor.claims.seeding counts them)
    # below this are not read (earlier designs were sized on them or decided on them), so the
    # looks count fresh seeds only (grids/claims/claims.yaml design.by_mode)
    first_seed: int = 0
    # alpha earlier designs already spent on claims this one tests again (their looks are final):
    # across the designs their family-wise bound is alpha + spent_before (union bound), not alpha.
    # Stated in the claims table; it changes no test.
    spent_before: float = 0.0
    retested: tuple[str, ...] = ()
    # the largest log-normal sigma of the seed noise's shapes (either skew sign) every one-sided
    # p-value stays valid under (``p_below``; grids/claims/claims.yaml design.skew); 0: Student's t
    skew: float = 0.0

    def __post_init__(self):
        if isinstance(self.first_seed, bool) or not isinstance(self.first_seed, int) or self.first_seed < 0:
            raise ValueError(f"first_seed must be an integer >= 0, got {self.first_seed!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if not self.looks or list(self.looks) != sorted(set(self.looks)) or self.looks[0] < 2:
            raise ValueError(f"looks must be increasing seed counts >= 2, got {self.looks}")
        if not self.rho > 0:
            raise ValueError(f"rho must be > 0, got {self.rho}")
        if not 0 <= self.skew <= _SKEW_GRID[-1]:
            raise ValueError(f"skew (log-normal sigma) must be in [0, {_SKEW_GRID[-1]}], got {self.skew!r}")
        if not 0 <= self.spent_before < 1 or bool(self.retested) != bool(self.spent_before):
            raise ValueError(f"spent_before must be in [0, 1) and name the claims it was spent on (retested), got "
                             f"{self.spent_before!r} on {self.retested!r}")

    def weights(self) -> np.ndarray:
        """The share of alpha spent at each look: alpha(t_k) - alpha(t_{k-1}), over alpha."""
        t = np.asarray(self.looks, dtype=np.float64) / self.looks[-1]
        spent = t ** self.rho
        return np.diff(np.concatenate([[0.0], spent]))

    def block_seeds(self, look: int) -> int:
        """The seeds a block needs for a claim to reach ``look`` fresh seeds: a block's seeds
        count (as offsets) from its first, the looks from offset ``first_seed``."""
        return self.first_seed + look

    def looks_within(self, n: int) -> list[int]:
        """The looks that n seeds reach."""
        return [k for k in self.looks if k <= n]


def sequential_p(p_by_look: list[np.ndarray], design: Design) -> np.ndarray:
    """min_k p_k / w_k over the looks taken (``p_by_look[k]`` at ``design.looks[k]``);
    1 when no look was taken. Valid under any dependence between looks (union bound)."""
    w = design.weights()
    if len(p_by_look) > len(w):
        raise ValueError(f"{len(p_by_look)} looks for a design of {len(w)}")
    out = np.asarray(1.0)
    for p, wk in zip(p_by_look, w):
        out = np.minimum(out, np.asarray(p) / wk)
    return np.minimum(out, 1.0)


def claim_p(comparisons: np.ndarray, design: Design, margin: float | None = None,
            floor=0.0) -> tuple[np.ndarray, np.ndarray]:
    """Sequential (p_hold, p_contra) of a claim whose comparisons are (..., K, n) with the
    seeds in the order they were added: every look n_k <= n uses the first n_k seeds.
    ``floor``: each comparison's sd floor (its metric's resolution)."""
    c = np.asarray(comparisons, dtype=np.float64)
    looks = design.looks_within(c.shape[-1])
    holds, contras = [], []
    for n in looks:
        x = c[..., :n]
        h, k = equivalence_p(x, margin, floor, design.skew) if margin else superiority_p(x, floor, design.skew)
        holds.append(h)
        contras.append(k)
    return sequential_p(holds, design), sequential_p(contras, design)


# --------------------------------------------------------------------------------------
# Across claims
# --------------------------------------------------------------------------------------
def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values along the last axis (reject where adjusted <= alpha)."""
    p = np.asarray(p, dtype=np.float64)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adjusted = np.minimum(1.0, np.maximum.accumulate(ranked, axis=-1))
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return out


def verdicts(p_hold: np.ndarray, p_contra: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm over the claims (last axis) of p = min(p_hold, p_contra): (adjusted p, verdict
    code: +1 holds, -1 contradicted, 0 undecided). p_hold and p_contra never both fall below
    alpha for valid data (they need opposite signs), and ties go to "undecided"."""
    p_hold, p_contra = np.asarray(p_hold, dtype=np.float64), np.asarray(p_contra, dtype=np.float64)
    adjusted = holm(np.minimum(p_hold, p_contra))
    decided = adjusted <= alpha
    code = np.where(decided & (p_hold < p_contra), 1, np.where(decided & (p_contra < p_hold), -1, 0))
    return adjusted, code


# --------------------------------------------------------------------------------------
# Power: the smallest effect n seeds detect, the seeds an effect needs, the chance a look decides
# --------------------------------------------------------------------------------------
def _nct_sf(x, dof, ncp):
    """P(T > x) for a noncentral t; scipy returns nan far in a tail, where the normal
    approximation (T ~ ncp + N(0, 1)) is accurate to the digits that matter here."""
    out = np.asarray(_st.nct.sf(x, dof, ncp), dtype=np.float64)
    return np.where(np.isnan(out), _st.norm.sf(np.asarray(x) - np.asarray(ncp)), out)


def _nct_cdf(x, dof, ncp):
    out = np.asarray(_st.nct.cdf(x, dof, ncp), dtype=np.float64)
    return np.where(np.isnan(out), _st.norm.cdf(np.asarray(x) - np.asarray(ncp)), out)


@functools.lru_cache(maxsize=4096)
def critical_t(q: float, dof: int, skew: float = 0.0) -> float:
    """The test's critical value: the smallest t whose one-sided p-value (``p_above``'s, the
    largest over Student's t and the shapes up to ``skew``) is at most ``q``; inf where no t
    reaches it (q below the tables' floor 1 / (draws + 1)). From the same tables as the
    p-values: a right-skewed table T gives p = (#{T_i >= t} + 1) / (draws + 1) for the
    left-skewed shape and (#{T_i <= -t} + 1) / (draws + 1) for the right one, so p <= q once
    t is past T's (j + 1)-th largest value and past minus its (j + 1)-th smallest,
    j = floor(q (draws + 1)) - 1. ``p_below`` is its mirror: p_below <= q when t < -critical_t."""
    c = float(_st.t.isf(q, dof))
    if not skew:
        return c
    j = math.floor(q * (_SKEW_DRAWS + 1)) - 1
    if j < 0:
        return math.inf
    for sigma in _shapes(skew):
        table = _skew_table(dof + 1, sigma)
        if j < len(table):
            c = max(c, -float(table[j]), float(table[len(table) - 1 - j]))
    return c


@functools.lru_cache(maxsize=96)
def _shape_u(n: int, sigma: float, sign: float, c: float) -> np.ndarray:
    """Sorted u_i = c s_i / sqrt(n) - sign m_i of ``_skew_draws``' samples, standardised (unit
    variance): a comparison of standardised true mean d under this shape (sign -1: its mirror)
    has t > c exactly when d > u_i, so P(t > c) is the share of u below d."""
    m, s = _skew_draws(n, sigma)
    sd = math.sqrt((math.exp(sigma ** 2) - 1) * math.exp(sigma ** 2))
    u = c * (s / sd) / math.sqrt(n) - sign * (m / sd)
    u.sort()
    return u


def _above(mu, sd, n: int, c: float, skew: float) -> np.ndarray:
    """P(t > c) of one comparison with true mean ``mu`` and seed sd ``sd`` at n seeds, the
    least over the shapes the test allows (the noncentral t for normal noise; each log-normal
    shape of either sign up to ``skew`` from its tabulated draws)."""
    mu, sd = np.asarray(mu, dtype=np.float64), np.asarray(sd, dtype=np.float64)
    out = _nct_sf(c, n - 1, mu * math.sqrt(n) / sd)
    d = mu / sd
    for sigma in _shapes(skew):
        for sign in (1.0, -1.0):
            u = _shape_u(n, sigma, sign, c)
            out = np.minimum(out, np.searchsorted(u, d, side="left") / len(u))
    return out


def _below(mu, sd, n: int, c: float, skew: float) -> np.ndarray:
    """P(t < -c), the least over the same shapes: the shapes come in mirror pairs, so it is
    ``_above`` at -mu for the tables (the noncentral t's own lower tail for normal noise)."""
    mu, sd = np.asarray(mu, dtype=np.float64), np.asarray(sd, dtype=np.float64)
    out = _nct_cdf(-c, n - 1, mu * math.sqrt(n) / sd)
    for sigma in _shapes(skew):
        for sign in (1.0, -1.0):
            u = _shape_u(n, sigma, sign, c)
            out = np.minimum(out, np.searchsorted(u, -mu / sd, side="left") / len(u))
    return out


def power_iut(delta: float, sds, n: int, level: float, skew: float = 0.0) -> float:
    """The chance that an intersection-union claim holds at n seeds when every one of its
    comparisons has true mean ``delta`` and its own sd (``sds``): each comparison's one-sided
    test at ``level`` / 2 (p_hold doubles the one-sided p) must pass, i.e. its t must exceed the
    test's critical value (``critical_t``: Student's t, or with ``skew`` the largest over the
    shapes the p-value is valid for). Each comparison's chance is the least over those noise
    shapes (``_above``: the noncentral t for normal noise, the tabulated draws for each
    log-normal shape), so the power holds for every shape the test allows. The product treats
    the comparisons as independent; comparisons that share a run correlate positively, which
    makes passing them all more likely (Slepian), so this is a lower bound and the MDE below
    is, if anything, too large."""
    sds = np.atleast_1d(np.asarray(sds, dtype=np.float64))
    if n < 2 or not np.all(np.isfinite(sds)) or not np.all(sds > 0):
        return math.nan
    crit = critical_t(level / 2, n - 1, skew)
    if not skew:
        return float(np.prod(_nct_sf(crit, n - 1, delta * math.sqrt(n) / sds)))
    return float(np.prod(_above(np.full(len(sds), delta), sds, n, crit, skew)))


def mde(sd, n: int, level: float, power: float = 0.8, skew: float = 0.0) -> float:
    """Minimum detectable effect: the common true mean of every comparison (sds ``sd``, a
    number or one per comparison) that n seeds find with probability ``power`` at the
    two-sided ``level`` (one-sided level/2 per comparison) under every noise shape the test
    allows (``skew``, ``power_iut``); nan for n < 2, inf where the level is below what the
    tabulated p-values resolve."""
    sds = np.atleast_1d(np.asarray(sd, dtype=np.float64))
    if n < 2 or not np.all(np.isfinite(sds)) or not np.all(sds > 0):
        return math.nan
    if not math.isfinite(critical_t(level / 2, n - 1, skew)):
        return math.inf
    if skew and len(sds) == 1:
        return float(sds[0]) * _mde_unit(n, level, power, skew)
    hi = float(sds.max())
    while power_iut(hi, sds, n, level, skew) < power:
        hi *= 2
    if not skew:
        from scipy.optimize import brentq

        return float(brentq(lambda d: power_iut(d, sds, n, level) - power, 0.0, hi, xtol=1e-12 * hi))
    lo = 0.0  # the tabulated shapes' power is a step function of delta: bisection, not brentq
    while hi - lo > 1e-10 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power_iut(mid, sds, n, level, skew) >= power else (mid, hi)
    return hi


@functools.lru_cache(maxsize=4096)
def _mde_unit(n: int, level: float, power: float, skew: float) -> float:
    """``mde`` of one comparison of sd 1 under the skew bound (the MDE scales with the sd): the
    largest over the shapes of the smallest standardised mean each one finds with ``power`` (the
    noncentral t's root for normal noise; for a tabulated shape the ``power`` quantile of its
    sorted u, ``_shape_u``, where its share of u below the mean reaches ``power``)."""
    from scipy.optimize import brentq

    crit, dof = critical_t(level / 2, n - 1, skew), n - 1
    hi = 1.0
    while float(_nct_sf(crit, dof, hi * math.sqrt(n))) < power:
        hi *= 2
    d = float(brentq(lambda x: float(_nct_sf(crit, dof, x * math.sqrt(n))) - power, 0.0, hi, xtol=1e-12 * hi))
    j = min(math.ceil(power * _SKEW_DRAWS), _SKEW_DRAWS) - 1  # the (j + 1)-th smallest u: share below it j / draws
    for sigma in _shapes(skew):
        for sign in (1.0, -1.0):
            d = max(d, float(np.nextafter(_shape_u(n, sigma, sign, crit)[j], math.inf)))
    return d


def mde_each(sds, n: int, level: float, power: float = 0.8, skew: float = 0.0) -> np.ndarray:
    """Each comparison's own minimum detectable effect, in its own units (its metric's): the
    true mean at which that comparison's one-sided test at ``level`` / 2 passes with
    probability ``power`` at n seeds (``mde`` of its sd alone). A claim's comparisons may be
    in different units (MaxVio and NLL), so one "common true mean" across them means nothing;
    the claims table reports the binding comparison's."""
    return np.array([mde(float(s), n, level, power, skew) for s in np.atleast_1d(np.asarray(sds, dtype=np.float64))])


def seeds_needed(effect: float, sd, level, power: float = 0.8, n_max: int = 1000, skew: float = 0.0) -> int | None:
    """The smallest n whose MDE is at most |effect| (None beyond n_max or without an effect).
    ``level``: a number, or a function of n (the level the design spends at that n's look).
    With ``skew`` the MDE is never below Student's (the critical value is at least Student's and
    normal noise is one of the shapes), so the search starts at Student's n and goes up by
    doubling steps, then halves the last step: the smallest n when the MDE falls with n (a
    level that does not fall with n), a few table builds instead of one per n."""
    sds = np.atleast_1d(np.asarray(sd, dtype=np.float64))
    if not (math.isfinite(effect) and np.all(np.isfinite(sds))) or effect == 0:
        return None

    def ok(n: int, sk: float) -> bool:
        lv = level(n) if callable(level) else level
        return bool(lv) and mde(sds, n, lv, power, sk) <= abs(effect)

    start = next((n for n in range(2, n_max + 1) if ok(n, 0.0)), None)
    if not skew or start is None or ok(start, skew):
        return start
    bad, step = start, 1  # the largest n known to miss
    while not ok(min(bad + step, n_max), skew):
        if bad + step >= n_max:
            return None
        bad, step = bad + step, 2 * step
    good = min(bad + step, n_max)
    while good - bad > 1:
        mid = (bad + good) // 2
        bad, good = (bad, mid) if ok(mid, skew) else (mid, good)
    return good


def chance_decides(c: np.ndarray, n_next: int, level: float, margin: float | None = None, floor=0.0,
                   draws: int = 512, skew: float = 0.0) -> float:
    """The chance that a claim with comparisons ``c`` (K, n) is decided, holds or
    contradicted, at ``n_next`` seeds and the two-sided ``level``: each comparison's true
    mean drawn from its current estimate and uncertainty (normal, mean x_bar, sd s/sqrt(n)),
    its sd taken as observed (floored), and for each draw the chance that every comparison
    passes (holds) or that some comparison fails the other way (contradicted, Bonferroni over
    K; equivalence: outside the margin), each against the test's critical value and the least
    over the noise shapes the test allows (``skew``: ``critical_t``, ``_above``; 0: Student's
    noncentral t). A predictive power for the planner (``mor.claims.seeding``), not a test:
    fixed draws, so the plan is reproducible."""
    c = np.asarray(c, dtype=np.float64)
    k, n = c.shape
    if n < 2 or n_next < 2:
        return math.nan
    sd = np.maximum(c.std(axis=1, ddof=1), np.asarray(floor, dtype=np.float64))
    if not np.all(sd > 0):
        return math.nan
    z = np.random.default_rng(0).standard_normal((draws, k))
    mu = c.mean(axis=1) + z * sd / math.sqrt(n)  # (draws, K)
    if skew:
        crit = critical_t(level / 2, n_next - 1, skew)  # holds; TOST: one-sided at level/2 each side (level = 2 alpha')
        if margin:
            inside = _above(mu + margin, sd, n_next, crit, skew) + _below(mu - margin, sd, n_next, crit, skew) - 1
            hold = np.prod(np.clip(inside, 0, 1), axis=1)
            crit_c = critical_t(level / (4 * k), n_next - 1, skew)
            out = _above(mu - margin, sd, n_next, crit_c, skew) + _below(mu + margin, sd, n_next, crit_c, skew)
            contra = 1 - np.prod(1 - np.clip(out, 0, 1), axis=1)
        else:
            hold = np.prod(_above(mu, sd, n_next, crit, skew), axis=1)
            crit_c = critical_t(level / (2 * k), n_next - 1, skew)
            contra = 1 - np.prod(1 - _below(mu, sd, n_next, crit_c, skew), axis=1)
        return float(np.clip(hold + contra, 0, 1).mean())
    dof, root = n_next - 1, math.sqrt(n_next)
    if margin:
        crit = float(_st.t.isf(level / 2, dof))  # TOST: one-sided at level/2 each side (level = 2 alpha')
        inside = (_nct_sf(crit, dof, (mu + margin) * root / sd) - _nct_sf(-crit, dof, (mu - margin) * root / sd))
        hold = np.prod(np.clip(inside, 0, 1), axis=1)
        crit_c = float(_st.t.isf(level / (4 * k), dof))
        out = (_nct_sf(crit_c, dof, (mu - margin) * root / sd) + _nct_cdf(-crit_c, dof, (mu + margin) * root / sd))
        contra = 1 - np.prod(1 - np.clip(out, 0, 1), axis=1)
    else:
        crit = float(_st.t.isf(level / 2, dof))
        hold = np.prod(_nct_sf(crit, dof, mu * root / sd), axis=1)
        crit_c = float(_st.t.isf(level / (2 * k), dof))
        contra = 1 - np.prod(1 - _nct_cdf(-crit_c, dof, mu * root / sd), axis=1)
    return float(np.clip(hold + contra, 0, 1).mean())
