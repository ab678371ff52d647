"""Figure 5b (§ 5.2): expert-choice router outputs per recursion, selected vs unselected.

From the parquet column ``router_output_hist`` (the eval job's normalised histograms of the
router output g over each recursion's candidates, shared bin edges): one row of panels per
expert-choice MoR run, one panel per recursion, selected tokens in blue, unselected in
orange. Written as ``figures/fig5b/`` with fig5b.png, fig5b.pdf and fig5b.csv (the bars).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mor.analysis.router_hist import histogram_bars, per_recursion  # noqa: E402
from mor.reports.analysis_common import run_title  # noqa: E402
from mor.reports.common import figure_note, load_results, save_figure  # noqa: E402
from mor.results import config_of  # noqa: E402


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, _ = load_results(results, grid)
    ec = df[(df["variant"] == "mor") & (df["router_type"] == "expert_choice") & df["router_output_hist"].notna()]
    if ec.empty:
        raise ValueError(f"{results}: no expert-choice MoR run with router output histograms")
    rows = ec.sort_values(["num_recursions", "run_id"]).to_dict("records")
    ncols = max(int(r["num_recursions"]) for r in rows)
    fig, axes = plt.subplots(len(rows), ncols, figsize=(3.0 * ncols, 0.5 + 2.3 * len(rows)), squeeze=False)
    bars = []
    for i, row in enumerate(rows):
        hists = per_recursion(row["router_output_hist"])
        for r in range(ncols):
            ax = axes[i][r]
            if r >= len(hists):
                ax.axis("off")
                continue
            b = histogram_bars(hists[r])
            ax.bar(b["left"], b["selected"], width=b["width"], align="edge", color="C0", alpha=0.75,
                   label=f"selected (n={hists[r]['n_selected']})")
            ax.bar(b["left"], b["unselected"], width=b["width"], align="edge", color="C1", alpha=0.75,
                   label=f"unselected (n={hists[r]['n_unselected']})")
            ax.set_title(f"recursion {r + 1}", fontsize=8)
            ax.set_xlabel(f"router output g (alpha = {config_of(row)['model']['router']['alpha']:g})", fontsize=7)
            if r == 0:
                ax.set_ylabel(f"{run_title(row)}\nnormalised count", fontsize=7)
            ax.legend(fontsize=6, frameon=False)
            ax.tick_params(labelsize=6)
            bars.append(pd.DataFrame({"run_id": row["run_id"], "recursion": r + 1, "bin_left": b["left"],
                                      "bin_width": b["width"], "selected": b["selected"], "unselected": b["unselected"]}))
    fig.suptitle(f"Figure 5b: expert-choice router outputs per recursion (mode {mode})", fontsize=10)
    fig.tight_layout()
    note = figure_note(ec, grid, mode, per="row", spread=False)
    return save_figure(fig, out, "fig5b", pd.concat(bars, ignore_index=True), dpi=150, note=note)
