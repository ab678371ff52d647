"""Runs that differ only in their seed, folded into one row: mean, standard deviation, n.

The paper reports one run per cell; our local numbers need several seeds before a
difference means anything (README, "Seeds"). ``fold_seeds`` groups a results frame by the
resolved config without ``train.seed`` and returns one row per group: numeric metrics
replaced by their mean over seeds, ``<metric> sd`` (sample standard deviation, ddof 1; null
for n = 1) and ``n_seeds``; a benchmark stderr becomes the root mean square of the seeds'
(``stderr_over_seeds``: they score the same documents). Identity columns keep the first seed's values, ``run_id`` lists
every run of the group. Tables call it before building rows, so a grid with one seed looks
exactly as before.
"""

from __future__ import annotations

import json
import math

import pandas as pd

SD = " sd"
MAPS = ("accuracy", "accuracy_norm", "accuracy_topk")  # task -> value maps, averaged key by key
STDERRS = ("avg_accuracy_stderr", "avg_accuracy_topk_stderr")  # a benchmark's sampling stderr: that of the mean over seeds
STDERR_MAPS = ("accuracy_stderr", "accuracy_norm_stderr", "accuracy_topk_stderr")
FOLDED = ("val_nll", "val_nll_causal", "avg_accuracy", "avg_accuracy_topk", "dead_token_ratio", "sampling_accuracy", "max_vio", "entropy",
          "mean_depth", "final_train_loss", "train_time_s")


def config_without_seed(config_json: str) -> str:
    cfg = json.loads(config_json)
    cfg.get("train", {}).pop("seed", None)
    return json.dumps(cfg, sort_keys=True)


def mean_sd(values: list[float]) -> tuple[float, float | None, int]:
    """Mean, sample standard deviation (None for one value) and count, NaNs dropped."""
    v = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return math.nan, None, 0
    m = sum(v) / len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
    return m, sd, len(v)


def stderr_over_seeds(stderrs: list[float]) -> float:
    """The benchmark-sampling stderr of the mean over seeds: the root mean square of the
    per-seed stderrs. Not sqrt(sum se_i^2) / n: every seed scores the SAME documents (the
    tasks' draw is fixed), so which documents were drawn is shared, not averaged away.
    NaNs dropped; nan when none."""
    v = [float(x) for x in stderrs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return math.sqrt(sum(x * x for x in v) / len(v)) if v else math.nan


def fold_seeds(df: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """One row per config-without-seed (see module docstring); metrics get mean / sd / n."""
    keys = df["config_json"].map(config_without_seed)
    rows = []
    for _, g in df.groupby(keys, sort=False):
        row = g.iloc[0].copy()
        row["run_id"] = ", ".join(g["run_id"])
        row["seeds"] = sorted(int(s) for s in g["seed"])
        row["n_seeds"] = len(g)
        for m in metrics:
            if m not in g.columns:
                continue
            mean, sd, _ = mean_sd(list(g[m]))
            row[m] = mean
            row[m + SD] = sd
        for m in STDERRS:
            if m in g.columns and len(g) > 1:
                row[m] = stderr_over_seeds(list(g[m]))
        for m in MAPS + STDERR_MAPS:  # per-task maps: each task's mean (or stderr of the mean) over seeds
            if m in g.columns:
                maps = [dict(v) for v in g[m] if isinstance(v, (dict, list)) and len(v)]
                keys = dict.fromkeys(k for d in maps for k in d)
                agg = (lambda xs: stderr_over_seeds(xs)) if m in STDERR_MAPS else (lambda xs: mean_sd(xs)[0])
                row[m] = {k: agg([d.get(k) for d in maps]) for k in keys} if maps else row[m]
        rows.append(row)
    return pd.DataFrame(rows).reset_index(drop=True)
