"""Figure 4b: the tying-scheme ablation, drawn from table10's parquet.

Validation NLL of each scheme against the number of recursions, one panel per scale, with
the full vanilla model (dashed) and the reduced vanilla of each Nr (dotted, the same unique
layers as the recursive model) as reference lines. Figure 6 shows the same runs as bars;
this is the compact line view. With several seeds a point is their mean and its error bar their sd. Written as ``figures/fig4b/`` with fig4b.png, .pdf, .csv.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mor.reports.common import TYING_NAMES, figure_note, honest_ylim, load_results, save_figure, scale_key  # noqa: E402
from mor.reports.seeds import fold_seeds  # noqa: E402


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, _ = load_results(results, grid)
    rec = df[df["variant"] != "vanilla"]
    if rec.empty:
        raise ValueError(f"{results}: no recursive runs to plot")
    scales = sorted(rec["paper_scale"].unique(), key=scale_key)
    fig, axes = plt.subplots(1, len(scales), figsize=(4.0 * len(scales), 3.4), squeeze=False)
    drawn = []
    for ax, scale in zip(axes[0], scales):
        sub = rec[rec["paper_scale"] == scale]
        nrs = sorted(int(n) for n in sub["num_recursions"].unique())
        for i, (tying, name) in enumerate(TYING_NAMES.items()):
            t = sub[sub["tying"] == tying]
            if t.empty:
                continue
            t = fold_seeds(t, ("val_nll",)).sort_values("num_recursions")  # mean over seeds, sd as error bar
            ax.errorbar(t["num_recursions"].astype(int), t["val_nll"], yerr=t["val_nll sd"].fillna(0).to_numpy(float),
                        fmt="o-", color=f"C{i}", label=name, capsize=3)
            drawn += [{"scale": scale, "series": name, "num_recursions": int(n), "val_nll": v, "sd": e}
                      for n, v, e in zip(t["num_recursions"], t["val_nll"], t["val_nll sd"])]
        van = df[(df["paper_scale"] == scale) & (df["variant"] == "vanilla")]
        van = fold_seeds(van, ("val_nll",)) if len(van) else van
        full = van[~van["reduced"].astype(bool)]
        for _, v in full.iterrows():
            ax.axhline(v["val_nll"], ls="--", color="0.3", lw=1, label="Vanilla")
            drawn.append({"scale": scale, "series": "Vanilla", "num_recursions": None, "val_nll": v["val_nll"]})
        red = van[van["reduced"].astype(bool)].sort_values("num_recursions")
        if len(red):
            ax.plot(red["num_recursions"].astype(int), red["val_nll"], ":", marker="s", color="0.5", ms=4,
                    label="Vanilla (reduced)")
            drawn += [{"scale": scale, "series": "Vanilla (reduced)", "num_recursions": int(n), "val_nll": v}
                      for n, v in zip(red["num_recursions"], red["val_nll"])]
        shown = [d for d in drawn if d["scale"] == scale]
        honest_ylim(ax, [d["val_nll"] for d in shown], [d.get("sd") for d in shown], mode)
        ax.set_xticks(nrs)
        ax.set_xlabel("recursions Nr")
        ax.set_title(f"{scale} (run at {sub['scale'].iloc[0]}, mode {mode})")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation NLL (lower is better)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.suptitle("Figure 4b: weight-tying schemes")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save_figure(fig, out, "fig4b", pd.DataFrame(drawn), dpi=150, note=figure_note(rec, grid, mode))
