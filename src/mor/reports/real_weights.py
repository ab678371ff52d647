"""tables/real_weights: the real 135M start point, SmolLM2-135M-Instruct (Q4_1), on this machine.

Two tables from grids/real_weights.yaml's parquet:

1. accuracy: the checkpoint itself (block ``start``) on the six benchmarks, acc +- stderr and
   acc_norm per task, beside the numbers Hugging Face published for SmolLM2-135M-Instruct
   (``PUBLISHED``). Those come from lighteval on the full standard test sets with lighteval's
   prompts; ours are lm-eval on OLMES-prompted copies (mor.lm_eval.tasks), 100 random documents
   a task, of the Q4_1-quantised weights: the comparison says whether the model is the one
   published (same ballpark, far above chance), not that the quantisation costs nothing.
2. step 0: every model of table12's local mode before up-training (``*-step0`` blocks; one
   AdamW step at lr 1e-30 leaves every nonzero weight bit for bit and moves the quantised
   weights' exact zeros by at most 1e-30):
   its validation NLL on the Django docs, beside the start checkpoint's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mor.reports.common import OutputDir, load_results, table_note, run_count, task_name

# Hugging Face, model card of HuggingFaceTB/SmolLM2-135M (README.md, "Instruction model" table:
# "All evaluations are zero-shot unless stated otherwise, and we use lighteval"), in %:
# HellaSwag 40.9, ARC (Average) 37.3, PIQA 66.3 for SmolLM2-135M-Instruct. ARC (Average) is the
# mean of ARC-Easy and ARC-Challenge; the card gives no LAMBADA and, for the instruct model, no
# WinoGrande (the base SmolLM2-135M's WinoGrande is 51.3).
PUBLISHED_SOURCE = ("huggingface.co/HuggingFaceTB/SmolLM2-135M, model card 'Instruction model' table "
                    "(lighteval, zero-shot)")
PUBLISHED = {"mor_hellaswag": 0.409, "mor_piqa": 0.663, "arc_average": 0.373}
ARC = ("mor_arc_easy", "mor_arc_challenge")
CHANCE = {"mor_lambada": 0.0, "mor_hellaswag": 0.25, "mor_piqa": 0.5, "mor_winogrande": 0.5,
          "mor_arc_easy": 0.25, "mor_arc_challenge": 0.25}


def accuracy_table(row: pd.Series) -> pd.DataFrame:
    """One row per task of the start checkpoint's result row, plus ARC's average and the mean."""
    acc, se = dict(row["accuracy"] or {}), dict(row["accuracy_stderr"] or {})
    norm, norm_se = dict(row["accuracy_norm"] or {}), dict(row["accuracy_norm_stderr"] or {})
    rows = []
    for t in sorted(acc):
        pub = PUBLISHED.get(t)
        rows.append({"Task": task_name(t), "acc": acc[t], "acc stderr": se.get(t), "acc_norm": norm.get(t),
                     "acc_norm stderr": norm_se.get(t), "chance": CHANCE.get(t), "published": pub})
    if all(t in acc for t in ARC):
        a = sum(acc[t] for t in ARC) / 2
        s = (sum(se[t] ** 2 for t in ARC) ** 0.5 / 2) if all(se.get(t) is not None for t in ARC) else None
        n = (sum(norm[t] for t in ARC) / 2) if all(t in norm for t in ARC) else None
        rows.append({"Task": "ARC (average of Easy, Challenge)", "acc": a, "acc stderr": s, "acc_norm": n,
                     "acc_norm stderr": None, "chance": 0.25, "published": PUBLISHED["arc_average"]})
    rows.append({"Task": "Mean of the six tasks", "acc": row["avg_accuracy"], "acc stderr": row["avg_accuracy_stderr"],
                 "acc_norm": None, "acc_norm stderr": None, "chance": sum(CHANCE.values()) / len(CHANCE),
                 "published": None})
    return pd.DataFrame(rows)


def step0_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in df.iterrows():
        cfg = json.loads(r["config_json"])["model"]
        rows.append({"Model": r["label"], "variant": r["variant"], "tying": r["tying"] if r["variant"] != "vanilla" else "",
                     "Nr": r["num_recursions"], "unique layers": r["unique_layers"],
                     "effective layers": r["effective_layers"], "Params": r["n_params"],
                     "Step-0 NLL": r["val_nll"], "NLL (causal)": r["val_nll_causal"], "val tokens": r["val_tokens"],
                     "init": f"{cfg['tied_init']} from {cfg['init_checkpoint']}", "run_id": r["run_id"]})
    order = {"vanilla": 0, "recursive": 1, "mor": 2}
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    return t.sort_values(["Nr", "variant", "tying"], key=lambda s: s.map(order) if s.name == "variant" else s
                         ).reset_index(drop=True)


def render(results: Path, grid: Path, out: Path, mode: str) -> list[Path]:
    df, _ = load_results(results, grid)
    start = df[df["accuracy"].map(lambda m: bool(m))] if "accuracy" in df else df.iloc[:0]
    steps = df[df["run_id"].isin(set(df["run_id"]) - set(start["run_id"]))]
    commits = ", ".join(c[:12] for c in sorted(df["git_commit"].unique()))
    step0 = step0_table(pd.concat([start, steps]))
    od = OutputDir(out)
    with od as d:
        parts = [f"# The real 135M start point: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32)\n\n"
                 + table_note(grid, mode, f"Mode '{mode}', {results} ({run_count(df)} runs, commit(s) {commits}).") + "\n"]
        if len(start):
            acc = accuracy_table(start.iloc[0])
            acc.to_csv(d / "accuracy.csv", index=False)
            parts.append("## Accuracy (lm-eval through the project's adapter, zero-shot)\n\n"
                         f"Published: {PUBLISHED_SOURCE}. Those are lighteval on the full test sets with its own "
                         "prompts, of the bf16 weights; these are OLMES-prompted copies (mor.lm_eval.tasks), a random "
                         "subset of documents per task (n in lm_eval.json), of the Q4_1-quantised weights, so "
                         "expect agreement within a few points, not equality.\n\n"
                         + acc.to_markdown(index=False, floatfmt=".4f") + "\n")
        if len(step0):
            step0.to_csv(d / "step0.csv", index=False)
            parts.append("## Validation NLL at step 0 (the Django docs, in the checkpoint's own tokenizer)\n\n"
                         "The start checkpoint itself and every model of table12's local mode before up-training "
                         "(stepwise initialisation; MoR's routers are new): up-training starts from these.\n\n"
                         + step0.drop(columns=["run_id"]).to_markdown(index=False, floatfmt=".4f") + "\n")
        (d / "real_weights.md").write_text("\n".join(parts))
    return od.files()
