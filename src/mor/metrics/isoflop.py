"""Compute-optimal model size under isoFLOP budgets (§ 5.1, Fig. 5a), as pure functions.

Per budget C and variant, the runs form an isoFLOP profile: validation NLL against model
size N (unique parameters). Following the isoFLOP-profile method of Hoffmann et al. (2022,
"approach 2"), a parabola in log10 N is fitted to each profile and its minimum is the
compute-optimal size N*(C) (a star in Fig. 5a). A profile whose parabola opens downwards, or
whose minimum falls outside the sizes trained, has no interior optimum: the best trained
size is used and the point is marked ``edge`` (the true optimum lies at or beyond it).

The optimal path joins the stars of one variant. Two slopes describe it:
  * ``path_slope``: d NLL / d log10 N along the stars, the line Fig. 5a draws. § 5.1 reads
    a flatter line (smaller |slope|) as "benefits more from parameter count";
  * ``size_exponent`` a in N* ~ C^a (least squares of log10 N* on log10 C): a larger a means
    the optimal policy grows the model faster with compute (larger models, fewer tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Optimum:
    budget: float
    n_params: float  # N*
    nll: float  # the fitted (or observed) NLL at N*
    kind: str  # 'fit' (interior parabola minimum) | 'edge' (best trained size; optimum at or beyond it)


def optimal_size(n_params: list[float], nll: list[float], budget: float) -> Optimum:
    """N* of one isoFLOP profile (see module docstring); needs >= 3 sizes for a fit."""
    if len(n_params) != len(nll) or not n_params:
        raise ValueError(f"need matching, non-empty sizes and NLLs, got {len(n_params)} and {len(nll)}")
    keep = [i for i, v in enumerate(nll) if v is not None and np.isfinite(v)]  # a run without an NLL: left out
    if not keep:
        raise ValueError("no finite NLL in the profile")
    n_params, nll = [n_params[i] for i in keep], [nll[i] for i in keep]
    x, y = np.log10(np.asarray(n_params, float)), np.asarray(nll, float)
    best = int(np.argmin(y))
    if len(x) >= 3 and len(set(x)) >= 3:
        c2, c1, c0 = np.polyfit(x, y, 2)
        if c2 > 0:
            xs = -c1 / (2 * c2)
            if x.min() <= xs <= x.max():
                return Optimum(budget, float(10**xs), float(c0 + c1 * xs + c2 * xs * xs), "fit")
    return Optimum(budget, float(n_params[best]), float(y[best]), "edge")


def optima_by_budget(df) -> list[Optimum]:
    """One variant's runs (a results frame with budget_flops, n_params, val_nll; seeds
    already folded or one per config): N* per budget, budgets ascending."""
    out = []
    for budget, g in sorted(df[df["budget_flops"].notna()].groupby("budget_flops"), key=lambda kv: kv[0]):
        g = g.sort_values("n_params")
        out.append(optimal_size(g["n_params"].tolist(), g["val_nll"].tolist(), float(budget)))
    return out


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept (nan with fewer than two distinct x)."""
    if len(set(xs)) < 2:
        return math.nan, math.nan
    slope, icpt = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(icpt)


def path_slope(optima: list[Optimum]) -> float:
    """d NLL / d log10 N through the stars (nan when the stars share one size)."""
    return _line([math.log10(o.n_params) for o in optima], [o.nll for o in optima])[0]


def size_exponent(optima: list[Optimum]) -> float:
    """a in N* ~ C^a over the budgets (nan with fewer than two budgets)."""
    return _line([math.log10(o.budget) for o in optima], [math.log10(o.n_params) for o in optima])[0]


def parabola(n_params: list[float], nll: list[float], grid: np.ndarray) -> np.ndarray | None:
    """The fitted profile evaluated at sizes ``grid`` (for drawing), None without a fit."""
    x = np.log10(np.asarray(n_params, float))
    if len(set(x)) < 3:
        return None
    return np.polyval(np.polyfit(x, np.asarray(nll, float), 2), np.log10(grid))
