"""Table 17 (§ 5.2): validation tokens grouped by the recursion depth they receive.

From the parquet columns ``sample_token_ids`` / ``sample_token_depths`` (the eval job keeps
the first validation windows of every MoR run), decoded with the run's tokenizer. Per run and
depth: how many tokens got that depth, their share, and the most frequent ones with their
count and the fraction of that token's occurrences that got this depth. Written as
``tables/table17/`` with table17.md, table17.csv (every token and depth) and table17.tex.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mor.analysis.token_depths import group_by_depth
from mor.reports.analysis_common import run_title
from mor.reports.common import OutputDir, load_results
from mor.reports.token_common import decoder, depth_runs

TOP = 12  # tokens listed per depth in the .md / .tex


def shown_token(text: str) -> str:
    """A token as printed: JSON-style escapes (newline, tab, quotes) inside quotes."""
    return json.dumps(text, ensure_ascii=False)


def render(results: Path, grid: Path, out: Path, mode: str, data_root: Path = Path("data")) -> list[Path]:
    df, _ = load_results(results, grid)
    md = [f"# Table 17: tokens by the recursion depth they receive (mode {mode})", "",
          "Tokens of the first validation windows, decoded with each run's tokenizer; depth = recursions the "
          "token received (teacher-forced top-k routing). 'of its occurrences': the share of that token's "
          "occurrences in the sample that got this depth.", ""]
    long, tex = [], []
    for row in depth_runs(df):
        groups = group_by_depth(row["sample_token_ids"], row["sample_token_depths"], decoder(row, data_root),
                                int(row["num_recursions"]))
        table = pd.DataFrame([{
            "Depth": g["depth"], "Tokens": g["n"], "Share": round(g["share"], 4),
            "Most frequent (count, of its occurrences)": ", ".join(
                f"{shown_token(t)} ({c}, {f:.0%})" for t, c, f in g["tokens"][:TOP]),
        } for g in groups])
        col = table.columns[-1]
        md_table = table.assign(**{col: table[col].str.replace("|", "\\|", regex=False)})  # a '|' token
        md += [f"## {run_title(row)} — `{row['run_id']}`", "", md_table.to_markdown(index=False), ""]
        tex.append(f"% {row['run_id']}\n" + table.to_latex(index=False, escape=True))
        for g in groups:
            for t, c, f in g["tokens"]:
                long.append({"run_id": row["run_id"], "num_recursions": int(row["num_recursions"]), "depth": g["depth"],
                             "token": t, "count": c, "fraction_of_token": round(f, 6)})
    od = OutputDir(out)
    with od as d:
        (d / "table17.md").write_text("\n".join(md))
        (d / "table17.tex").write_text("\n".join(tex))
        pd.DataFrame(long).to_csv(d / "table17.csv", index=False)
    return od.files()
