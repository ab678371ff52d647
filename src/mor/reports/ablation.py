"""Ablation tables (13-16): one row per run, the axes that vary across the grid as columns,
then the metrics the paper reports for that table.

The varying axes are read from each row's ``config_json`` (never from logs), so a new axis
added to a grid shows up as a new column without code changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from mor.claims import pick
from mor.reports.common import (ACC_NOTE, PROTOCOL_NOTE, latex, reading_note, table_note, OutputDir, load_results, metric_cells,
                                protocol_accuracy_cells, protocol_nll_cells, reference_value, result_tasks, run_count,
                                seed_count, shown)

IGNORED = {"grid", "label", "model.scale"}  # identity, not ablation axes
METRIC_NAMES = {
    "val_nll": "NLL", "val_nll_causal": "NLL (causal)", "avg_accuracy": "Avg acc", "dead_token_ratio": "Dead token ratio",
    "sampling_accuracy": "Sampling acc", "max_vio": "MaxVio", "entropy": "Entropy",
    "mean_depth": "Mean depth", "n_params": "Params", "unique_layers": "Unique layers",
    "effective_layers": "Effective layers",
}


@dataclass(frozen=True)
class AblationSpec:
    name: str
    title: str
    metrics: tuple[str, ...]
    paper_note: Callable[[pd.DataFrame], str] | None = None  # numbers the paper states that no row matches


def _dead_token_note(df: pd.DataFrame) -> str:
    """App. G.3 states one number for Table 13 that belongs to no single row: the dead-token
    ratio of some aux-router variants reaches 66.7%. Shown beside the largest reproduced one."""
    aux = pick(df, model__router__aux="aux_router")
    top = aux["dead_token_ratio"].max() if len(aux) else float("nan")
    here = "no aux-router run" if pd.isna(top) else f"{top:.1%}"
    return f"Paper (App. G.3): the dead-token ratio of some aux-router variants reaches 66.7%; here the largest is {here}."


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def varying_axes(configs: list[dict]) -> list[str]:
    """Config keys whose value differs between runs, in config order."""
    flat = [flatten(c) for c in configs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    return [k for k in keys if k not in IGNORED and len({repr(f.get(k)) for f in flat}) > 1]


def build_table(df: pd.DataFrame, ref: list[dict], metrics: tuple[str, ...]) -> pd.DataFrame:
    configs = [json.loads(c) for c in df["config_json"]]
    axes = varying_axes(configs)
    tasks = result_tasks(df)
    papers = {m for x in ref for m in x}  # the metrics the paper gives a number for
    rows = []
    for cfg, (_, r) in zip(configs, df.iterrows()):
        flat = flatten(cfg)
        row = {"Scale": r["paper_scale"]}
        row.update({k.removeprefix("model.").removeprefix("router."): flat.get(k) for k in axes})
        for m in metrics:
            if m == "val_nll":  # both evaluation protocols, the paper's number beside the authors'
                row.update(protocol_nll_cells(r, reference_value(ref, r, m), with_paper=m in papers))
                continue
            if m == "avg_accuracy":  # the average, its stderr and every task's acc, under both protocols
                row.update(protocol_accuracy_cells(r, tasks, reference_value(ref, r, m), with_paper=m in papers))
                continue
            row.update(metric_cells(r, m, METRIC_NAMES.get(m, m)))
            paper = reference_value(ref, r, m)
            if paper is not None:
                row[f"Paper {METRIC_NAMES.get(m, m)}"] = paper
        row.update(seed_count(r))
        row["run_id"] = r["run_id"]
        rows.append(row)
    table = pd.DataFrame(rows)
    sort_cols = list(table.columns[: 1 + len(axes)])  # scale, then the axes
    return table.sort_values(sort_cols, key=lambda s: s.astype(str)).reset_index(drop=True)


def render_ablation(spec: AblationSpec, results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, ref = load_results(results, grid, fold=True)
    table = build_table(df, ref, spec.metrics)
    commits = ", ".join(c[:12] for c in sorted(df["git_commit"].unique()))
    od = OutputDir(out)
    with od as d:
        printed = shown(table)
        (d / f"{spec.name}.md").write_text(
            f"# {spec.title}\n\n"
            + table_note(grid, mode, f"Reproduced in mode '{mode}' from {results} ({run_count(df)} runs, commit(s) {commits}).",
                         PROTOCOL_NOTE, ACC_NOTE, reading_note(table), spec.paper_note(df) if spec.paper_note else "")
            + "\n\n" + printed.to_markdown(index=False) + "\n")
        table.to_csv(d / f"{spec.name}.csv", index=False)
        (d / f"{spec.name}.tex").write_text(latex(printed.drop(columns=["run_id"])))
    return od.files()


def _table3_note(df: pd.DataFrame) -> str:
    """Table 3's numbers are not in the sources this suite reads (PAPER.md names the main results
    [paper] without numbers; the seed text holds none), so the table says so instead of a column."""
    return ("Paper (§ 3.1, Table 3): its NLL and accuracies are not in ../shared/PAPER.md or the seed text, so no "
            "'Paper' column; grids/table3.yaml's `reference:` takes them, with their section, when at hand.")


SPECS = {
    "table3": AblationSpec("table3", "Table 3: Vanilla / Recursive / MoR at 360M and 16.5e18 FLOPs, as the authors "
                           "released them", ("val_nll", "avg_accuracy", "n_params", "effective_layers"),
                           paper_note=_table3_note),
    "deciding": AblationSpec("deciding", "The deciding runs behind tables/claims (3 seeds; locally 3M tokens, "
                             "the balancing pair 262K)", ("val_nll", "max_vio", "entropy", "mean_depth", "n_params")),
    "table11": AblationSpec("table11", "Table 11: Middle-Cycle vs Cycle at equal unique layers",
                            ("val_nll", "avg_accuracy", "n_params", "unique_layers", "effective_layers")),
    "table12": AblationSpec("table12", "Table 12: up-training from a pretrained vanilla checkpoint",
                            ("val_nll", "avg_accuracy", "n_params")),
    "table13": AblationSpec("table13", "Table 13: expert-choice router designs",
                            ("val_nll", "avg_accuracy", "dead_token_ratio", "sampling_accuracy", "mean_depth"),
                            paper_note=_dead_token_note),
    "table14": AblationSpec("table14", "Table 14: token-choice router designs",
                            ("val_nll", "avg_accuracy", "max_vio", "entropy", "mean_depth")),
    "table15": AblationSpec("table15", "Table 15: KV cache sharing", ("val_nll", "avg_accuracy", "n_params")),
    "table16": AblationSpec("table16", "Table 16: relaxations of KV sharing", ("val_nll", "avg_accuracy", "n_params")),
}
