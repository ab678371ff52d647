"""Figure 6 (App. F): validation NLL of each tying scheme per scale and Nr, vanilla lines.

Written as ``figures/fig6/`` with fig6.png, fig6.pdf and fig6.csv (the numbers drawn). A
point per scheme and Nr with ±1 sd over seeds (no bar, in the plot or the legend, for one seed);
the paper's numbers in a text of their own centred under the scheme's name (``annotate_paper``);
the y-axis at least SPAN_PER_SPREAD seed spreads tall (mor.reports.common.honest_ylim), and
the evidence level and seeds stamped under the figure.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import pandas as pd  # noqa: E402

from mor.reports.common import (TYING_NAMES, figure_note, honest_ylim, load_results, paper_theme,  # noqa: E402
                                reference_value, save_figure, scale_key)
from mor.reports.seeds import fold_seeds  # noqa: E402


PAPER_GID = "paper:"  # gid of the text holding a scheme's paper numbers: "paper:<scheme>" (tests read it)


def paper_lines(ref: list[dict], sub: pd.DataFrame, scheme: str) -> str:
    """The paper's NLLs of one scheme in a panel, one line per Nr ('Nr=2: 3.007'); '' when none."""
    lines = []
    for _, r in sub[sub["Tying"] == scheme].sort_values("num_recursions").iterrows():
        value = reference_value(ref, r, "val_nll")
        if value is not None:
            lines.append(f"Nr={int(r['num_recursions'])}: {value:.3f}")
    return "\n".join(lines)


def annotate_paper(ax, ref: list[dict], sub: pd.DataFrame, order: list[str]) -> None:
    """Each scheme's paper numbers in a text of their own, centred on that scheme's slot under
    its tick label (one short line per Nr, so it never spreads into a neighbour's slot, as one
    long tick label did): the x is the scheme's own category, never a tick label's layout."""
    labels = ax.get_xticklabels()  # set_xticks first: one per scheme, at the scheme's x
    for i, scheme in enumerate(order):
        text = paper_lines(ref, sub, scheme)
        if text:  # anchored to the bottom centre of the scheme's own tick label, wherever layout puts it
            ax.annotate("paper\n" + text, xy=(0.5, 0), xycoords=labels[i], xytext=(0, -2),
                        textcoords="offset points", ha="center", va="top", fontsize=6.5, color="0.3",
                        annotation_clip=False, gid=f"{PAPER_GID}{scheme}")


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, ref = load_results(results, grid)
    rec = df[df["variant"] != "vanilla"].copy()
    if rec.empty:
        raise ValueError(f"{results}: no recursive runs to plot")
    rec["Tying"] = rec["tying"].map(TYING_NAMES)
    scales = sorted(rec["paper_scale"].unique(), key=scale_key)
    paper_theme()
    fig, axes = plt.subplots(1, len(scales), figsize=(4.4 * len(scales), 3.9), squeeze=False)
    order = [t for t in TYING_NAMES.values() if t in set(rec["Tying"])]
    # one colour and one dodge offset per Nr over every panel, so the one legend entry of an Nr is
    # what each panel draws for it (a panel holding Nr 3 alone used Nr 2's colour)
    all_nrs = sorted(int(n) for n in rec["num_recursions"].unique())
    colour = {nr: plt.cm.Blues(0.45 + 0.5 * j / max(1, len(all_nrs) - 1)) for j, nr in enumerate(all_nrs)}
    offset = {nr: (j - (len(all_nrs) - 1) / 2) * 0.5 / len(all_nrs) for j, nr in enumerate(all_nrs)}
    drawn = []
    legend: dict[str, object] = {}  # label -> handle, over every panel (a label drawn in one panel only is kept)
    for ax, scale in zip(axes[0], scales):
        sub = fold_seeds(rec[rec["paper_scale"] == scale], ("val_nll",))
        nrs = sorted(int(n) for n in sub["num_recursions"].unique())
        # a point per scheme and Nr (dodged within the scheme's slot): the mean over seeds, the error
        # bar their sd; points, not bars: the axis need not start at zero. seaborn's pointplot (dodge,
        # errorbar="sd") draws the same points, but not as one ErrorbarContainer per Nr whose legend
        # glyph has a bar exactly when the points do (yerr None for one seed: a marker, no bar, in the
        # legend too), so this loop stays and seaborn is no dependency (issue 60)
        for nr in nrs:
            g = sub[sub["num_recursions"] == nr].copy()
            g["x"] = [order.index(t) + offset[nr] for t in g["Tying"]]
            sd = g["val_nll sd"].astype(float)
            ax.errorbar(g["x"], g["val_nll"], yerr=None if sd.isna().all() else sd.fillna(0).to_numpy(float),
                        fmt="o", color=colour[nr], ms=5, capsize=3, label=f"Nr={nr}")
            drawn += [{"scale": scale, "series": r["Tying"], "num_recursions": nr, "val_nll": r["val_nll"],
                       "val_nll_sd": r["val_nll sd"], "n": r["n_seeds"]} for _, r in g.iterrows()]
        van = fold_seeds(df[(df["paper_scale"] == scale) & (df["variant"] == "vanilla")], ("val_nll",))
        for _, v in van.iterrows():
            style = ":" if v["reduced"] else "--"
            lab = f"Vanilla reduced Nr={int(v['num_recursions'])}" if v["reduced"] else "Vanilla"
            color = f"C{1 + int(v['num_recursions'])}" if v["reduced"] else "0.3"
            ax.axhline(v["val_nll"], ls=style, lw=1, color=color, label=lab)
            drawn.append({"scale": scale, "series": lab, "num_recursions": None, "val_nll": v["val_nll"],
                          "val_nll_sd": v["val_nll sd"], "n": v["n_seeds"]})
        ax.set_xticks(range(len(order)), order, fontsize=7)
        annotate_paper(ax, ref, sub, order)  # the paper's numbers under their scheme, never over a line or a point
        ax.set_xlim(-0.5, len(order) - 0.5)
        lines = van if len(van) else pd.DataFrame({"val_nll": [], "val_nll sd": []})
        honest_ylim(ax, [*sub["val_nll"], *lines["val_nll"]], [*sub["val_nll sd"], *lines["val_nll sd"]], mode)
        ax.set_title(f"{scale} (run at {rec[rec['paper_scale'] == scale]['scale'].iloc[0]}, mode {mode})")
        ax.set_ylabel("validation NLL (lower is better)")
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels = sorted(legend, key=lambda k: (not k.startswith("Nr="), k))  # the points by Nr, then the lines
    fig.legend([legend[k] for k in labels], labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.suptitle("Figure 6: parameter-sharing strategies")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save_figure(fig, out, "fig6", pd.DataFrame(drawn), note=figure_note(rec, grid, mode))
