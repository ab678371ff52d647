"""Figure 4a (App. E): decoding throughput relative to Vanilla against validation NLL, and
the table of its numbers.

Each run's row holds its throughput job's measurements (mor.engine.job: tokens/s over the
forward passes and over the wall time, at the fixed batch and at the relative maximum
batch). A model's speed is divided by that of the Vanilla run of the same effective depth
(``decode_baseline_layers``; App. E: MoR-4 Middle-Cycle against the Vanilla with its 34
layers), at the same setting; Vanilla's own maximum-batch setting is the base batch (32),
so both panels compare with Vanilla at 32. The quality axis is ``val_nll_causal``: the NLL
under the causal routing the speed was measured with (teacher-forced top-k NLL would pair a
routing decoding never uses with its speed). The FLOPs-predicted speed-up
(mor.flops.decode_flops_per_token) at the recursion shares the routers really kept is drawn
beside each measured point (hollow marker), and measured / predicted is taken against it;
the design-capacity prediction is listed beside it (trained routers keep fewer tokens than
their capacity, so it flatters). The table also gives the engine's batching: mean rows per
shared-block pass as a fraction of the batch, and shared-block passes per generated token.
Speed-ups, rows per pass and passes per token share one window (the passes run while
requests wait: mor.engine.job), with the whole run's beside them. A MoR run without
``val_nll_causal`` has an empty NLL (named in the figure, not drawn): its top-k NLL is not
relabelled as the causal one (models without routers have one NLL, which is causal).

    figures/fig4a/  fig4a.png, fig4a.pdf, fig4a.csv (the numbers drawn)
    tables/fig4a/   fig4a.md, fig4a.csv, fig4a.tex (with App. E's maximum batches beside ours)
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mor.reports.common import OutputDir, figure_note, table_note, load_results, reference_value, save_figure, shown  # noqa: E402

SETTINGS = (("fixed", "fixed batch (32)"), ("max", "relative maximum batch"))
ROUTED = ("mor",)  # variants whose teacher-forced (top-k) NLL is not the decoding one
PAPER_NOTE = ("App. E (360M, H100): relative maximum batch MoR-2 42, MoR-3 48, MoR-4 51; Fig. 4a shows up to "
              "about 2x Vanilla's throughput (MoR-4, maximum batch). Throughput = generated tokens / time inside "
              "the forward passes (App. E's timing) while requests wait, as are rows/pass and passes/token; "
              "'whole run' = the same over every pass; 'wall' = / the whole engine run's wall time.")


def throughput_table(df: pd.DataFrame, ref: list[dict] | None = None) -> pd.DataFrame:
    """One row per run: its NLL, batches, and throughput relative to the same-depth Vanilla."""
    df = df.dropna(subset=["decode_tokens_per_s_wall_fixed", "decode_tokens_per_s_wall_max"])
    if df.empty or df[["decode_tokens_per_s_fixed", "decode_tokens_per_s_max"]].isna().all().any():
        raise ValueError("no run has throughput measurements (decode_* columns); run the throughput jobs")
    vanilla = df[df["variant"] == "vanilla"]
    rows = []
    for _, r in df.sort_values(["variant", "effective_layers", "num_recursions"]).iterrows():
        depth = r.get("decode_baseline_layers")
        depth = r["effective_layers"] if depth is None or pd.isna(depth) else depth
        base = vanilla[vanilla["effective_layers"] == depth]
        if base.empty:
            raise ValueError(f"run {r['run_id']}: no Vanilla run with its effective depth {depth} "
                             "to normalise its throughput to")
        b = base.iloc[0]
        causal = r.get("val_nll_causal")
        if (causal is None or pd.isna(causal)) and r["variant"] not in ROUTED:
            causal = r["val_nll"]  # no router: the top-k NLL is the causal one
        row = {"run_id": r["run_id"], "model": r["label"], "variant": r["variant"],
               "num_recursions": int(r["num_recursions"]), "effective_layers": int(r["effective_layers"]),
               "baseline": b["label"], "baseline_layers": int(depth), "val_nll": r["val_nll"],
               "val_nll_causal": float("nan") if causal is None or pd.isna(causal) else causal,  # a gap, never top-k
               "max_batch": r["decode_max_batch"],
               "batch_max": r["decode_batch_max"],
               "paper_batch_max": (reference_value(ref or [], r, "max_batch") if r["variant"] != "vanilla" else 32)}
        for name, _ in SETTINGS:
            row[f"rel_{name}"] = _ratio(r.get(f"decode_tokens_per_s_{name}"), b.get(f"decode_tokens_per_s_{name}"))
            row[f"rel_run_{name}"] = _ratio(r.get(f"decode_tokens_per_s_run_{name}"), b.get(f"decode_tokens_per_s_run_{name}"))
            row[f"rel_wall_{name}"] = r[f"decode_tokens_per_s_wall_{name}"] / b[f"decode_tokens_per_s_wall_{name}"]
            row[f"tokens_per_s_{name}"] = r[f"decode_tokens_per_s_{name}"]
            row[f"occupancy_{name}"] = r[f"decode_occupancy_{name}"]
            row[f"row_fill_{name}"] = r.get(f"decode_row_fill_{name}")
            row[f"passes_per_token_{name}"] = r.get(f"decode_passes_per_token_{name}")
            for k in ("tokens_per_s", "row_fill", "passes_per_token"):
                row[f"{k}_run_{name}"] = r.get(f"decode_{k}_run_{name}")
        realised = r.get("decode_flops_speedup_realised")
        row["flops_predicted"] = r["decode_flops_speedup"]
        row["flops_predicted_realised"] = float("nan") if realised is None or pd.isna(realised) else realised
        row["measured_over_predicted"] = row["rel_fixed"] / row["flops_predicted_realised"]
        row["measured_over_design"] = row["rel_fixed"] / row["flops_predicted"]
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio(a, b) -> float:
    """a / b, NaN where either is missing (a visible gap in the table and the figure)."""
    if a is None or b is None or pd.isna(a) or pd.isna(b) or not b:
        return float("nan")
    return float(a) / float(b)


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(throughput, nll) points no other point beats on both (higher throughput, lower NLL),
    by ascending throughput."""
    front, best = [], float("inf")
    for x, y in sorted(points, key=lambda p: (-p[0], p[1])):
        if y < best:
            front.append((x, y))
            best = y
    return front[::-1]


def render_figure(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, ref = load_results(results, grid)
    t = throughput_table(df, ref)
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.8), sharey=True)
    colors = plt.get_cmap("tab10")
    for ax, (name, title) in zip(axes, SETTINGS):
        pts = []
        for i, r in enumerate(t.itertuples()):
            c = colors(i % 10)
            x = getattr(r, f"rel_{name}")
            y = r.val_nll_causal
            ax.scatter([x], [y], color=c, s=36, zorder=3, label=r.model)
            if r.variant != "vanilla":
                ax.scatter([r.flops_predicted_realised], [y], facecolors="none", edgecolors=c, s=36, zorder=3)
                ax.plot([x, r.flops_predicted_realised], [y, y], color=c, lw=0.6, ls=":")
            batch = "" if pd.isna(r.batch_max) else f" (b={int(r.batch_max) if name == 'max' else 32})"
            ax.annotate(f"{r.model}{batch}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
            pts.append((x, y))
        gaps = sorted(t.loc[t["val_nll_causal"].isna(), "model"])
        if gaps:
            ax.text(0.02, 0.02, "no causal NLL (not drawn): " + ", ".join(gaps), transform=ax.transAxes, fontsize=6)
        pts = [(x, y) for x, y in pts if not pd.isna(y)]
        front = pareto(pts) if pts else []
        if front:
            ax.plot(*zip(*front), color="0.3", lw=1.0, ls="--", zorder=2, label="Pareto front")
        ax.axvline(1.0, color="0.8", lw=0.8, zorder=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("throughput / the same-depth Vanilla's", fontsize=8)
    axes[0].set_ylabel("validation NLL (causal routing; lower is better)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7, frameon=False)
    fig.suptitle(f"Figure 4a: decoding throughput vs NLL (mode {mode})\n"
                 "filled: measured; hollow: FLOPs-predicted at the capacities the routers kept", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return save_figure(fig, out, "fig4a", t, note=figure_note(df, grid, mode))


def render_table(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, ref = load_results(results, grid)
    t = throughput_table(df, ref)
    cols = {"model": "Model", "baseline": "vs", "val_nll_causal": "NLL (causal)", "val_nll": "NLL (top-k)",
            "max_batch": "max batch (memory)", "batch_max": "rel. max batch", "paper_batch_max": "paper rel. max batch",
            "rel_fixed": "speedup b=32", "rel_run_fixed": "speedup b=32 (whole run)", "rel_wall_fixed": "speedup b=32 (wall)",
            "rel_max": "speedup max b", "rel_run_max": "speedup max b (whole run)", "rel_wall_max": "speedup max b (wall)",
            "flops_predicted_realised": "FLOPs-predicted (kept shares)", "flops_predicted": "FLOPs-predicted (design)",
            "measured_over_predicted": "measured / predicted (b=32, kept shares)",
            "row_fill_fixed": "rows/pass / batch (b=32)", "passes_per_token_fixed": "block passes/token (b=32)",
            "row_fill_run_fixed": "rows/pass / batch (b=32, whole run)",
            "passes_per_token_run_fixed": "block passes/token (b=32, whole run)",
            "row_fill_max": "rows/pass / batch (max b)", "passes_per_token_max": "block passes/token (max b)",
            "row_fill_run_max": "rows/pass / batch (max b, whole run)",
            "passes_per_token_run_max": "block passes/token (max b, whole run)"}
    printed = shown(t[["run_id", *cols]].round(3).rename(columns=cols))
    od = OutputDir(out)
    with od as d:
        t.to_csv(d / "fig4a.csv", index=False)
        (d / "fig4a.md").write_text(f"# Figure 4a numbers: decoding throughput (mode {mode})\n\n{table_note(grid, mode, PAPER_NOTE)}\n\n"
                                    + printed.to_markdown(index=False) + "\n")
        (d / "fig4a.tex").write_text(printed.drop(columns=["run_id"]).to_latex(index=False, escape=True))
    return od.files()
