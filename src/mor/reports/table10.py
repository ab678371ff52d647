"""Table 10 (App. F): tying schemes x scale x Nr, against full and reduced vanilla.

Written as ``tables/table10/`` holding table10.md, table10.csv and table10.tex. The
'paper NLL' column shows the numbers the paper states (grid ``reference:``); reproduced
numbers at CPU scale are not expected to match them in value, only in ordering.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mor.reports.common import (ACC_NOTE, LOCAL_NLL_SEED_SPREAD, PROTOCOL_NOTE, SPREAD_MARK, TYING_NAMES, OutputDir,
                                direction_header, inside_spread, latex, load_results, marked, protocol_accuracy_cells,
                                protocol_nll_cells, reading_note, reference_value, result_tasks, run_count, scale_key,
                                seed_count, seeds_in, shown, spread_of, table_note)


# What 'dNLL vs reduced' compares with (App. F; grids/table10.yaml). App. F's text compares the
# schemes "to vanilla reduced models" (Middle-Cycle "shows the largest improvement in average
# accuracy compared to vanilla reduced models") and, for Table 12, calls them "the reduced baseline
# models that are initialized in the same manner but without recursion"; it states no depth. We
# take ONE reduced Vanilla per Nr for all four schemes, with L / Nr layers
# (mor.model.tying.reduced_depth): a Cycle or Sequence model's unique-layer count (15 and 10 of
# SmolLM's 30 at Nr 2 and 3, docs/real_weights.md). The Middle schemes keep their first and last
# layers unshared, so they hold more unique layers than that baseline (the row's 'Layers
# (unique/effective)' says how many); at the CPU scales' few layers the gap is a large fraction.
REDUCED_NOTE = ("'dNLL vs reduced' = the row's NLL minus that of the Vanilla (reduced) with the same Nr (negative: "
                "the scheme beats it); that baseline has L/Nr layers, the unique layers of a Cycle or Sequence model "
                "(one reduced Vanilla per Nr for all four schemes; App. F gives no depth), so Middle-Cycle and Middle-Sequence, whose "
                "first and last layers are unshared, hold more unique layers and parameters than it: see each row's "
                "'Layers (unique/effective)' and 'Params'.")


SPREAD_NOTE = (f"'{SPREAD_MARK}' after a 'dNLL vs reduced': the difference is inside the seed spread (smaller than the "
               f"larger seed sd of the two rows, or, for one seed in mode local, than the stated local spread {LOCAL_NLL_SEED_SPREAD:.2f}), so it is "
               "no evidence of a difference either way ('dNLL inside seed spread' in the .csv).")


def build_table(df: pd.DataFrame, ref: list[dict], mode: str = "local") -> pd.DataFrame:
    rows = []
    tasks = result_tasks(df)
    scale_order = {s: i for i, s in enumerate(sorted(df["paper_scale"].unique(), key=scale_key))}
    for _, r in df.iterrows():
        reduced = bool(r["reduced"])
        if r["variant"] == "vanilla" and not reduced:
            model, nr = "Vanilla", "-"
        elif reduced:
            model, nr = "Vanilla (reduced)", int(r["num_recursions"])
        else:
            model, nr = TYING_NAMES.get(r["tying"], r["tying"]), int(r["num_recursions"])
        base = df[(df["paper_scale"] == r["paper_scale"]) & df["reduced"] & (df["num_recursions"] == r["num_recursions"])]
        delta = r["val_nll"] - base["val_nll"].iloc[0] if len(base) and r["variant"] != "vanilla" else None
        spread = None
        if delta is not None:
            b = base.iloc[0]
            sds = [r.get("val_nll sd"), b.get("val_nll sd")]
            spread = spread_of(sds, min(int(r.get("n_seeds", 1)), int(b.get("n_seeds", 1))), mode)
        rows.append({
            "Scale": r["paper_scale"], "Local scale": r["scale"], "Nr": nr, "Model": model,
            "Params": int(r["n_params"]), "Layers (unique/effective)": f"{r['unique_layers']}/{r['effective_layers']}",
            **protocol_nll_cells(r, reference_value(ref, r, "val_nll")), **seed_count(r),
            "dNLL vs reduced": None if delta is None else round(float(delta), 4),
            "dNLL inside seed spread": inside_spread(delta, spread),
            **protocol_accuracy_cells(r, tasks, reference_value(ref, r, "avg_accuracy"),
                                      with_paper=any("avg_accuracy" in x for x in ref)),
            "run_id": r["run_id"],
            "_order": (scale_order[r["paper_scale"]], 0 if nr == "-" else int(nr), 0 if reduced else 1, model),
        })
    table = pd.DataFrame(rows).sort_values("_order").drop(columns="_order").reset_index(drop=True)
    return table


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, ref = load_results(results, grid, fold=True)
    table = build_table(df, ref, mode)
    commits = sorted(df["git_commit"].unique())
    note = table_note(grid, mode,
                      f"Reproduced in mode '{mode}' from {results} ({run_count(df)} runs, seed(s) {seeds_in(df)}, "
                      f"commit(s) {', '.join(c[:12] for c in commits)}).",
                      "'Paper NLL' is the value stated in the paper (App. F) where it gives one.", PROTOCOL_NOTE,
                      REDUCED_NOTE, SPREAD_NOTE, ACC_NOTE, reading_note(table))
    od = OutputDir(out)
    with od as d:
        printed = shown(table.drop(columns="dNLL inside seed spread"))
        head = direction_header("dNLL vs reduced")
        printed[head] = [marked(v, inside) for v, inside in zip(table["dNLL vs reduced"], table["dNLL inside seed spread"])]
        (d / "table10.md").write_text(f"# Table 10: parameter-sharing strategies\n\n{note}\n\n"
                                      + printed.to_markdown(index=False) + "\n")
        table.to_csv(d / "table10.csv", index=False)
        (d / "table10.tex").write_text(latex(printed.drop(columns=["run_id"])))
    return od.files()
