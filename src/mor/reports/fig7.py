"""Figures 7 and 8 (App. H.1): key and value states of a trained Recursive model across depths.

    fig7  magnitude: mean L2 norm of the key / value state per effective layer (rows, the
          recursion blocks marked) and token position (columns)
    fig8  cosine similarity of the same token's key / value states between every two
          effective layers (averaged over tokens, heads and sequences)

Keys and values side by side, one row of panels per Recursive run. Drawn from the runs' kv
analysis files (``mor.analysis.kv_states``, results/runs/<run_id>.kv.npz); written as
``figures/fig7/`` and ``figures/fig8/`` (png, pdf, and the arrays as csv).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mor.reports.analysis_common import load_sidecar, run_title, runs_with  # noqa: E402
from mor.reports.common import figure_note, load_results, save_figure  # noqa: E402


def _kv_runs(results: Path, grid: Path):
    df, _ = load_results(results, grid)
    rows = runs_with(df[df["variant"] != "mor"], "kv").sort_values(["variant", "run_id"]).to_dict("records")
    if not rows:
        raise ValueError(f"{results}: no Vanilla / Recursive run with a kv analysis to plot")
    return [(r, *load_sidecar(results, r, "kv")) for r in rows]


def _recursion_bounds(meta: dict) -> list[float]:
    """Row boundaries between the blocks (prefix | recursion 1 | ... | suffix), for lines."""
    prefix, per, nr, _ = meta["recursion_layers"]
    return [prefix + r * per - 0.5 for r in range(nr + 1) if 0 < prefix + r * per < len(meta["depth_labels"])]


def _draw(results: Path, grid: Path, out: Path, mode: str, which: str) -> list[Path]:
    runs = _kv_runs(results, grid)
    n = len(runs)
    fig, axes = plt.subplots(n, 2, figsize=(10 if which == "magnitude" else 8, 0.6 + 3.2 * n), squeeze=False)
    tables = []
    for i, (row, meta, a) in enumerate(runs):
        labels = meta["depth_labels"]
        for j, kind in enumerate(("key", "value")):
            ax = axes[i][j]
            m = a[f"{kind}_{which}"]
            if which == "magnitude":
                im = ax.imshow(m, aspect="auto", cmap="viridis", interpolation="nearest")
                ax.set_xlabel("token position")
                for b in _recursion_bounds(meta):
                    ax.axhline(b, color="white", lw=0.8)
                frame = pd.DataFrame(m, index=labels, columns=[f"pos{t}" for t in range(m.shape[1])])
            else:
                im = ax.imshow(m, cmap="magma", vmin=min(0.0, float(m.min())), vmax=1.0, interpolation="nearest")
                ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
                for b in _recursion_bounds(meta):
                    ax.axhline(b, color="white", lw=0.6)
                    ax.axvline(b, color="white", lw=0.6)
                frame = pd.DataFrame(m, index=labels, columns=labels)
            ax.set_yticks(range(len(labels)), labels, fontsize=6)
            ax.set_title(f"{kind}s: {run_title(row)}", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
            frame.insert(0, "state", kind)
            frame.insert(0, "run_id", row["run_id"])
            tables.append(frame.rename_axis("layer").reset_index())
    name = "fig7" if which == "magnitude" else "fig8"
    what = "magnitude (mean L2 norm)" if which == "magnitude" else "cosine similarity across depths"
    fig.suptitle(f"Figure {name[3:]}: key / value {what} (mode {mode})", fontsize=10)
    fig.tight_layout()
    shown = pd.DataFrame([r for r, _, _ in runs])
    note = figure_note(shown, grid, mode, per="row", spread=False)
    return save_figure(fig, out, name, pd.concat(tables, ignore_index=True), dpi=150, note=note)


def render_fig7(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    return _draw(results, grid, out, mode, "magnitude")


def render_fig8(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    return _draw(results, grid, out, mode, "cosine")
