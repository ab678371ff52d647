"""Figure 6 (App. F): validation NLL of each tying scheme per scale and Nr, vanilla lines.

Written as ``figures/fig6/`` with fig6.png and fig6.pdf (seaborn).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from mor.reports.common import TYING_NAMES, OutputDir, load_results, reference_value  # noqa: E402
from mor.reports.seeds import fold_seeds  # noqa: E402


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, ref = load_results(results, grid)
    rec = df[df["variant"] != "vanilla"].copy()
    if rec.empty:
        raise ValueError(f"{results}: no recursive runs to plot")
    rec["Tying"] = rec["tying"].map(TYING_NAMES)
    rec["Nr"] = rec["num_recursions"].astype(int).astype(str)
    scales = sorted(rec["paper_scale"].unique(), key=lambda s: (len(s), s))
    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(1, len(scales), figsize=(4.2 * len(scales), 3.4), squeeze=False)
    order = [t for t in TYING_NAMES.values() if t in set(rec["Tying"])]
    for ax, scale in zip(axes[0], scales):
        sub = rec[rec["paper_scale"] == scale]
        # one bar per scheme and Nr: the mean over seeds, the error bar their sd (none for one seed)
        sns.barplot(data=sub, x="Tying", y="val_nll", hue="Nr", order=order, ax=ax, palette="Blues", errorbar="sd")
        van = fold_seeds(df[(df["paper_scale"] == scale) & (df["variant"] == "vanilla")], ("val_nll",))
        for _, v in van.iterrows():
            style = ":" if v["reduced"] else "--"
            lab = f"Vanilla reduced Nr={int(v['num_recursions'])}" if v["reduced"] else "Vanilla"
            color = f"C{1 + int(v['num_recursions'])}" if v["reduced"] else "0.3"
            ax.axhline(v["val_nll"], ls=style, lw=1, color=color, label=lab)
        hues = sorted(sub["Nr"].unique())
        for _, r in fold_seeds(sub, ("val_nll",)).iterrows():  # one annotation per bar
            paper = reference_value(ref, r, "val_nll")
            if paper is not None:  # seaborn dodges hue bars within a 0.8-wide slot
                x = order.index(r["Tying"]) + (hues.index(r["Nr"]) - (len(hues) - 1) / 2) * 0.8 / len(hues)
                ax.annotate(f"paper\n{paper:.3f}", (x, r["val_nll"]), fontsize=6,
                            ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
        lo = min(sub["val_nll"].min(), van["val_nll"].min() if len(van) else 1e9)
        hi = max(sub["val_nll"].max(), van["val_nll"].max() if len(van) else 0)
        ax.set_ylim(lo - 0.1 * (hi - lo + 1e-3) - 0.02, hi + 0.15 * (hi - lo + 1e-3) + 0.02)
        ax.set_title(f"{scale} (run at {sub['scale'].iloc[0]}, mode {mode})")
        ax.set_xlabel("")
        ax.set_ylabel("validation NLL")
        ax.tick_params(axis="x", labelrotation=20)
        handles, labels = ax.get_legend_handles_labels()
        ax.get_legend().remove()
    labels = [f"Nr={lab}" if lab.isdigit() else lab for lab in labels]
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.suptitle("Figure 6: parameter-sharing strategies")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    od = OutputDir(out)
    with od as d:
        fig.savefig(d / "fig6.png", dpi=150)
        fig.savefig(d / "fig6.pdf")
    plt.close(fig)
    return od.files()
