"""The training log, ``runs/<run_id>/train_log.jsonl``, read into a table (pure reader).

The trainer (``mor.train.trainer``) appends one JSON object per logged step:

    step, loss (LM loss), aux_loss (weighted router losses), lr, grad_norm,
    tokens_per_s, model_flops_per_s, mfu, tokens_seen

and, for MoR runs, a router statistic of the step (``max_vio`` for token-choice,
``sampling_accuracy`` for expert-choice: ``mor.train.trainer.router_stats``; any of
``ROUTER_KEYS`` is drawn). A run resumed from a checkpoint
trims its log to the checkpoint's step before appending, so a step appears once; a torn
last line (a job killed mid-write) is skipped here, as the trainer drops it on resume.
Reports draw training curves from this reader and never import the trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mor.layout import run_dir
from mor.layout import TRAIN_LOG_FILE as LOG_FILE
ROUTER_KEYS = ("aux_loss", "max_vio", "sampling_accuracy", "entropy", "dead_token_ratio")
COLUMNS = ("step", "tokens_seen", "loss", "aux_loss", "lr", "grad_norm", "tokens_per_s")


class TrainLogError(ValueError):
    """A train log is missing or holds no step; the message names the file."""


def read_train_log(path: str | Path) -> pd.DataFrame:
    """One row per logged step, ascending; the standard columns always present (NaN if absent)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TrainLogError(f"{path}: no train log (has the run started?)") from None
    rows = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line
        if isinstance(rec, dict) and "step" in rec:
            rows.append(rec)
    if not rows:
        raise TrainLogError(f"{path}: no logged step")
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df:
            df[c] = float("nan")
    return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def read_grid_logs(runs_root: str | Path, grid: str, run_ids: list[str]) -> pd.DataFrame:
    """The logs of ``run_ids`` of ``grid`` stacked, with a ``run_id`` column."""
    frames = [read_train_log(run_dir(runs_root, rid) / LOG_FILE).assign(run_id=rid) for rid in run_ids]
    return pd.concat(frames, ignore_index=True)


def router_keys(log: pd.DataFrame) -> list[str]:
    """The router statistics a log carries with any non-zero value."""
    return [k for k in ROUTER_KEYS if k in log and log[k].fillna(0).abs().sum() > 0]
