"""``tables/claims/claims_forest.png``: the claims table as the picture a reader looks at first.

One row per claim that has an interval: its mean effect and interval (the binding comparison's,
at the table's level), drawn against 0, the line a superiority or non-inferiority claim must
clear (every effect is oriented so that > 0 is what the paper says; a non-inferiority margin is
already inside the effect), or against its +-margin for an equivalence claim, whose interval
must lie between the two. Colour is the verdict. Effects are in each claim's own units (NLL,
ratios, ranks), so the x axis is shared for the reference lines, not for comparing sizes.

``forest_frame`` is a pure function of the claims table and the pre-registered margins; what it
returns is what ``draw_forest`` draws, written beside the image as ``claims_forest.csv``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

# one colour per verdict (colour-blind safe: Okabe-Ito), in the legend's order
VERDICT_COLOURS = {"holds": "#009E73", "contradicted": "#D55E00", "inconclusive": "#E69F00",
                   "not tested in this mode": "#999999"}
COLUMNS = ["claim", "verdict", "mean", "lo", "hi", "margin", "interval", "colour"]


def forest_frame(table: pd.DataFrame, margins: dict[str, float | None]) -> pd.DataFrame:
    """The rows the forest plot draws, top to bottom in the table's order: every claim with a
    finite interval (``raw lo``, ``raw hi``), its ``mean effect``, its equivalence ``margin``
    (nan: the reference is 0), the interval's level and its verdict's colour."""
    rows = []
    for _, r in table.iterrows():
        lo, hi = _num(r.get("raw lo")), _num(r.get("raw hi"))
        if math.isnan(lo) or math.isnan(hi):
            continue  # not built, below the first look, or no matching runs: no interval to draw
        margin = margins.get(r["claim"])
        rows.append({"claim": r["claim"], "verdict": r["verdict"], "mean": _num(r.get("mean effect")), "lo": lo,
                     "hi": hi, "margin": float(margin) if margin else math.nan, "interval": r.get("interval", ""),
                     "colour": VERDICT_COLOURS.get(r["verdict"], VERDICT_COLOURS["not tested in this mode"])})
    return pd.DataFrame(rows, columns=COLUMNS)


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def draw_forest(frame: pd.DataFrame, png: Path, note: str) -> None:
    """Draw ``frame`` (``forest_frame``) to ``png``: a horizontal interval and a point per
    claim, the zero line, each equivalence claim's +-margin as a shaded band on its own row, and
    ``note`` (the evidence: mode, seeds, Holm) under the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    n = max(len(frame), 1)
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.38 * n))
    for i, r in enumerate(frame.itertuples(index=False)):
        y = n - 1 - i  # the table's first claim at the top
        if not math.isnan(r.margin):
            ax.fill_betweenx([y - 0.35, y + 0.35], -r.margin, r.margin, color="0.85", lw=0, zorder=0,
                             gid=f"margin:{r.claim}")
        ax.plot([r.lo, r.hi], [y, y], color=r.colour, lw=2.2, solid_capstyle="butt", gid=f"interval:{r.claim}")
        if not math.isnan(r.mean):
            ax.plot([r.mean], [y], "o", color=r.colour, ms=5)
    ax.axvline(0, color="0.2", lw=0.8, ls="--", zorder=1)
    ax.set_yticks(range(n), list(frame["claim"])[::-1] if len(frame) else [""], fontsize=8)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("effect (> 0: as the paper says; each claim in its own units)", fontsize=8)
    ax.grid(axis="x", color="0.9", lw=0.6)
    shown = [v for v in VERDICT_COLOURS if v in set(frame["verdict"])]
    handles = [Line2D([], [], color=VERDICT_COLOURS[v], lw=2.2, marker="o", ms=5) for v in shown]
    if frame["margin"].notna().any():
        handles.append(plt.Rectangle((0, 0), 1, 1, color="0.85"))
        shown.append("equivalence margin")
    if handles:
        ax.legend(handles, shown, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    if not len(frame):
        ax.text(0.5, 0.5, "no claim has an interval yet", transform=ax.transAxes, ha="center", va="center")
    ax.set_title("The paper's claims: each interval against 0 (or its equivalence margin)", fontsize=9)
    fig.text(0.01, 0.005, note, fontsize=6.5, color="0.3", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(png, dpi=150)
    plt.close(fig)
