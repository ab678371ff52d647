"""Table 9 (§ 5.1, App. F): Vanilla / Recursive / MoR across scales and isoFLOP budgets.

Written as ``tables/table9/`` holding
  table9.md / .csv / .tex   one row per run: budget, scale, parameters, the tokens and steps
                            the budget bought (mor.budget), FLOPs spent / budget, NLL and the
                            six accuracies;
  optimal.md / .csv         the compute-optimal size per variant and budget, and the slopes
                            of each variant's optimal path (mor.metrics.isoflop; Fig. 5a);
  maxbatch.md / .csv        App. E's relative maximum batch (mor.reports.maxbatch).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from mor.reports import maxbatch
from mor.reports.common import ACC_NOTE, latex, reading_note, OutputDir, table_note, accuracy_cells, has_mor, load_results, metric_cells, result_tasks, run_count, scale_key, seed_count, seeds_in, shown
from mor.metrics.isoflop import optima_by_budget, path_slope, size_exponent

VARIANTS = {"vanilla": "Vanilla", "recursive": "Recursive", "mor": "MoR"}


def variant_name(r) -> str:
    return VARIANTS.get(r["variant"], r["variant"])


def build_table(df: pd.DataFrame) -> pd.DataFrame:
    tasks, causal = result_tasks(df), has_mor(df)
    rows = []
    for _, r in df.iterrows():
        budget = r.get("budget_flops")
        rows.append({
            "Model": variant_name(r), "Scale": r["paper_scale"], "Local scale": r["scale"],
            "Budget (FLOPs)": None if budget is None or pd.isna(budget) else f"{budget:.3g}",
            "Params": int(r["n_params"]), "Layers (unique/effective)": f"{r['unique_layers']}/{r['effective_layers']}",
            "Tokens": int(r["train_tokens"]), "Steps": int(r["train_steps"]),
            "FLOPs spent / budget": None if budget is None or pd.isna(budget) else round(r["train_flops"] / budget, 4),
            **metric_cells(r, "val_nll", "NLL"), **seed_count(r),
            **({"NLL (causal)": None if pd.isna(r["val_nll_causal"]) else round(float(r["val_nll_causal"]), 4)}
               if causal else {}),
            **accuracy_cells(r, tasks),
            "run_id": r["run_id"],
            "_order": (list(VARIANTS).index(r["variant"]) if r["variant"] in VARIANTS else 9,
                       scale_key(r["paper_scale"]), budget if budget is not None and not pd.isna(budget) else 0),
        })
    return pd.DataFrame(rows).sort_values("_order").drop(columns="_order").reset_index(drop=True)


def optimal_table(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per variant and budget: N* (mor.metrics.isoflop); per variant: the path's slopes."""
    rows, paths = [], []
    sub = df[df["budget_flops"].notna()]
    for variant in [v for v in VARIANTS if v in set(sub["variant"])]:
        runs = sub[sub["variant"] == variant]
        optima = optima_by_budget(runs)
        for o in optima:
            g = runs[runs["budget_flops"] == o.budget]
            best = g.loc[g["val_nll"].idxmin()]
            budget = o.budget
            rows.append({"Model": VARIANTS[variant], "Budget (FLOPs)": f"{budget:.3g}", "Sizes": len(g),
                         "Best trained scale": f"{best['paper_scale']} ({best['scale']})",
                         "Best trained NLL": round(float(best["val_nll"]), 4),
                         "N* (params)": int(round(o.n_params)), "NLL at N*": round(o.nll, 4), "N* from": o.kind})
        paths.append({"Model": VARIANTS[variant], "Budgets": len(optima),
                      "Path slope dNLL/dlog10 N": _r(path_slope(optima)),
                      "Size exponent a (N* ~ C^a)": _r(size_exponent(optima)),
                      "Interior optima": sum(o.kind == "fit" for o in optima)})
    return pd.DataFrame(rows), pd.DataFrame(paths)


def _r(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 4)


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, _ = load_results(results, grid, fold=True)
    table = build_table(df)
    optimal, paths = optimal_table(df)
    commits = ", ".join(c[:12] for c in sorted(df["git_commit"].unique()))
    seeds = seeds_in(df)
    note = table_note(grid, mode, f"Reproduced in mode '{mode}' from {results} ({run_count(df)} runs, seed(s) {seeds}, "
                      f"commit(s) {commits}).",
                      "Each run trains the whole number of optimizer steps whose FLOPs (mor.flops) are closest to its "
                      "budget, so 'FLOPs spent / budget' is within half a step of 1.", ACC_NOTE, reading_note(table))
    opt_note = ("N*: the minimum of a parabola in log10(params) fitted to each isoFLOP profile ('fit'); 'edge' = the "
                "parabola has no minimum inside the trained sizes, and N* is the best trained size (the optimum lies "
                "at or beyond it). Path slope: dNLL/dlog10 N through the stars (Fig. 5a's line; § 5.1 reads a flatter "
                "line as 'benefits more from parameters'); a: N* ~ C^a (a larger a favours larger models, fewer "
                f"tokens). Seeds {seeds}, folded into their mean per point: see the README on seed spread before reading "
                "differences.")
    mb = maxbatch.max_batch_table()
    od = OutputDir(out)
    with od as d:
        printed = shown(table)
        (d / "table9.md").write_text("# Table 9: Vanilla / Recursive / MoR under isoFLOP budgets\n\n"
                                     f"{note}\n\n" + printed.to_markdown(index=False) + "\n")
        table.to_csv(d / "table9.csv", index=False)
        (d / "table9.tex").write_text(latex(printed.drop(columns=["run_id"])))
        (d / "optimal.md").write_text("# Compute-optimal size per budget (Fig. 5a)\n\n" + opt_note + "\n\n"
                                      + (optimal.to_markdown(index=False) if len(optimal) else "(no budgeted runs)")
                                      + "\n\n## Optimal path per variant\n\n"
                                      + (paths.to_markdown(index=False) if len(paths) else "") + "\n")
        optimal.to_csv(d / "optimal.csv", index=False)
        paths.to_csv(d / "optimal_path.csv", index=False)
        (d / "maxbatch.md").write_text("# App. E: relative maximum batch of MoR-2/3/4 at 360M (vanilla = 32)\n\n"
                                       + maxbatch.note() + "\n\n" + mb.to_markdown(index=False) + "\n")
        mb.to_csv(d / "maxbatch.csv", index=False)
    return od.files()
