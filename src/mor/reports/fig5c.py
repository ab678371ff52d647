"""Figure 5c (§ 5.3, test-time scaling): validation NLL with the maximum recursion depth
capped at 1..Nr, one group of bars per model (MoR Nr = 2, 3, 4 in grids/fig5c.yaml).

Drawn from the runs' depth_cap analysis files (``mor.analysis.depth_cap``,
results/runs/<run_id>.depth_cap.npz, one per run whatever grids list it). Two panels: the training top-k routing
(``val_nll``, the paper's number) and the causal routing decoding uses. Written as
``figures/fig5c/`` with fig5c.png, fig5c.pdf and fig5c.csv (the numbers drawn).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mor.reports.analysis_common import load_sidecar, run_title, runs_with  # noqa: E402
from mor.reports.common import figure_note, honest_ylim, load_results, save_figure  # noqa: E402


def capped_table(results: Path, df: pd.DataFrame) -> pd.DataFrame:
    """Long table: run_id, label, num_recursions, max_depth, val_nll, val_nll_causal."""
    rows = []
    for r in runs_with(df, "depth_cap").sort_values(["num_recursions", "run_id"]).to_dict("records"):
        _, a = load_sidecar(results, r, "depth_cap")
        for d, nll, causal in zip(a["max_depth"], a["val_nll"], a["val_nll_causal"]):
            rows.append({"run_id": r["run_id"], "label": run_title(r), "num_recursions": int(r["num_recursions"]),
                         "max_depth": int(d), "val_nll": float(nll), "val_nll_causal": float(causal),
                         "full_depth_val_nll": float(r["val_nll"])})
    if not rows:
        raise ValueError(f"{results}: no Recursive or MoR runs with a depth_cap analysis to plot")
    return pd.DataFrame(rows)


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, _ = load_results(results, grid)
    table = capped_table(results, df)
    runs = list(dict.fromkeys(table["run_id"]))
    max_nr = int(table["max_depth"].max())
    colors = plt.get_cmap("Blues")([0.35 + 0.6 * i / max(1, max_nr - 1) for i in range(max_nr)])
    fig, axes = plt.subplots(1, 2, figsize=(4.0 + 1.6 * len(runs), 3.6), squeeze=False, sharey=True)
    width = 0.8 / max_nr
    for ax, col, title in zip(axes[0], ("val_nll", "val_nll_causal"), ("top-k routing (training)", "causal routing (decoding)")):
        for i, rid in enumerate(runs):
            sub = table[table["run_id"] == rid]
            n = len(sub)
            for j, (_, r) in enumerate(sub.iterrows()):
                x = i + (j - (n - 1) / 2) * width
                ax.bar(x, r[col], width=width * 0.95, color=colors[r["max_depth"] - 1], label=f"max depth {r['max_depth']}")
                ax.annotate(f"{r[col]:.2f}", (x, r[col]), fontsize=6, ha="center", va="bottom", xytext=(0, 1),
                            textcoords="offset points")
        honest_ylim(ax, [*table["val_nll"], *table["val_nll_causal"]], (), mode)
        ax.set_xticks(range(len(runs)), [table[table["run_id"] == rid]["label"].iloc[0].replace(" (", "\n(") for rid in runs],
                      fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("validation NLL (lower is better)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    by_label = dict(sorted(dict(zip(labels, handles)).items(), key=lambda kv: int(kv[0].split()[-1])))
    fig.legend(list(by_label.values()), list(by_label), loc="lower center", ncol=len(by_label), fontsize=7, frameon=False)
    fig.suptitle(f"Figure 5c: NLL as the maximum recursion depth grows (mode {mode})", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    note = figure_note(df[df["run_id"].isin(runs)], grid, mode, per="run")
    return save_figure(fig, out, "fig5c", table, note=note)
