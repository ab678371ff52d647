"""Figure 5a (§ 5.1): compute-optimal scaling under isoFLOP budgets.

One panel per variant (Vanilla, Recursive, MoR), as § 5.1 compares the variants' optimal
paths: validation NLL against model size (unique parameters, log scale), one isoFLOP
profile per budget (points and the fitted parabola), the compute-optimal point of each
budget as a star, and the optimal path (the line through the stars) with its slope in the
legend (mor.metrics.isoflop). Written as ``figures/fig5a/`` with fig5a.png, .pdf and
fig5a.csv (the stars).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mor.reports.common import figure_note, load_results, save_figure  # noqa: E402
from mor.reports.seeds import fold_seeds  # noqa: E402
from mor.metrics.isoflop import optimal_size, parabola, path_slope  # noqa: E402
from mor.reports.table9 import VARIANTS  # noqa: E402


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, _ = load_results(results, grid)
    df = df[df["budget_flops"].notna()]
    if df.empty:
        raise ValueError(f"{results}: no runs with train.budget_flops to draw isoFLOP profiles from")
    note = figure_note(df, grid, mode)
    df = fold_seeds(df, ("val_nll",))  # a point per config: the mean over seeds, the sd as error bar
    variants = [v for v in VARIANTS if v in set(df["variant"])]
    budgets = sorted(df["budget_flops"].unique())
    colors = {b: plt.cm.viridis(i / max(1, len(budgets) - 1) * 0.85) for i, b in enumerate(budgets)}
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), sharey=True, squeeze=False)
    stars = []
    for ax, variant in zip(axes[0], variants):
        optima = []
        for b in budgets:
            g = df[(df["variant"] == variant) & (df["budget_flops"] == b)].sort_values("n_params")
            if g.empty:
                continue
            n, y = g["n_params"].to_numpy(float), g["val_nll"].to_numpy(float)
            ax.errorbar(n, y, yerr=g["val_nll sd"].fillna(0).to_numpy(float), fmt="o", color=colors[b], ms=4,
                        capsize=2, label=f"{b:.3g} FLOPs")
            xs = np.geomspace(n.min(), n.max(), 60)
            curve = parabola(list(n), list(y), xs)
            if curve is not None:
                ax.plot(xs, curve, "-", color=colors[b], lw=1, alpha=0.7)
            o = optimal_size(list(n), list(y), float(b))
            optima.append(o)
            ax.plot(o.n_params, o.nll, "*", color=colors[b], ms=13, mec="black", mew=0.6,
                    fillstyle="full" if o.kind == "fit" else "none")
            stars.append({"variant": variant, "budget_flops": b, "n_params_opt": o.n_params, "nll_opt": o.nll,
                          "kind": o.kind})
        if len(optima) >= 2:
            slope = path_slope(optima)
            ax.plot([o.n_params for o in optima], [o.nll for o in optima], "--", color="black", lw=1,
                    label=f"optimal path, slope {slope:.3f} / decade" if np.isfinite(slope) else "optimal path")
        ax.set_xscale("log")
        ax.set_title(f"{VARIANTS[variant]} (mode {mode})")
        ax.set_xlabel("parameters (unique)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper right")
    axes[0][0].set_ylabel("validation NLL (lower is better)")
    fig.suptitle("Figure 5a: isoFLOP profiles and compute-optimal path (stars; hollow = at the edge of the sizes)")
    fig.tight_layout()
    return save_figure(fig, out, "fig5a", pd.DataFrame(stars), dpi=150, note=note)
