"""Figure 1 (right, § 5.2): validation text with each token coloured by its recursion depth.

From the parquet columns ``sample_token_ids`` / ``sample_token_depths`` (the first validation
window of each MoR run), decoded token by token with the run's tokenizer and laid out in a
monospace grid (``mor.analysis.token_depths.layout``). One panel per MoR run. Written as
``figures/fig1/`` with fig1.png, fig1.pdf and fig1.csv (token, depth).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import pandas as pd  # noqa: E402

from mor.analysis.token_depths import layout, token_pieces  # noqa: E402
from mor.reports.analysis_common import run_title  # noqa: E402
from mor.reports.common import figure_note, load_results, save_figure  # noqa: E402
from mor.reports.token_common import decoder, depth_runs, seq_len  # noqa: E402

WIDTH = 96  # characters per line
FONT = 7.0  # points
CHAR_W = 0.6 * FONT / 72  # inches per monospace character
LINE_H = 1.55 * FONT / 72  # inches per line


def depth_colors(nr: int) -> list:
    cmap = plt.get_cmap("YlOrRd")
    return [cmap(0.08 + 0.6 * i / max(1, nr - 1)) for i in range(nr)]  # light enough for black text


def render(results: Path, grid: Path, out: Path, mode: str, data_root: Path = Path("data")) -> list[Path]:
    df, _ = load_results(results, grid)
    panels, rows = [], []
    for row in depth_runs(df):
        t = seq_len(row)
        pieces = token_pieces(row["sample_token_ids"][:t], row["sample_token_depths"][:t], decoder(row, data_root))
        pieces = [(text.replace("\t", "    "), d) for text, d in pieces]
        placed = layout(pieces, WIDTH)
        panels.append((row, placed, 1 + max((p[0] for p in placed), default=0)))
        rows += [{"run_id": row["run_id"], "position": i, "token": text, "depth": d} for i, (text, d) in enumerate(pieces)]
    heights = [LINE_H * (n + 2.5) for _, _, n in panels]
    top = 0.45  # inches for the title
    fig, axes = plt.subplots(len(panels), 1, figsize=(CHAR_W * WIDTH + 0.6, sum(heights) + top + 0.1),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (row, placed, n_lines) in zip(axes[:, 0], panels):
        nr = int(row["num_recursions"])
        colors = depth_colors(nr)
        ax.set_xlim(0, WIDTH)
        ax.set_ylim(n_lines, -0.2)
        ax.axis("off")
        for line, col, text, d in placed:
            ax.text(col, line + 0.5, text, family="monospace", fontsize=FONT, va="center", ha="left",
                    parse_math=False, bbox={"facecolor": colors[d - 1], "edgecolor": "none", "pad": 0.6})
        ax.set_title(run_title(row), fontsize=8, loc="left")
        ax.legend(handles=[Patch(color=c, label=f"depth {i + 1}") for i, c in enumerate(colors)], fontsize=6,
                  loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=nr, frameon=False)
    fig.suptitle(f"Figure 1 (right): recursion depth per token on validation text (mode {mode})", fontsize=9)
    fig.subplots_adjust(left=0.02, right=0.98, top=1 - (top + 0.1) / (sum(heights) + top + 0.1), bottom=0.02, hspace=0.45)
    note = figure_note(df[df["run_id"].isin([p[0]["run_id"] for p in panels])], grid, mode, per="panel", spread=False)
    return save_figure(fig, out, "fig1", pd.DataFrame(rows), dpi=170, note=note)
