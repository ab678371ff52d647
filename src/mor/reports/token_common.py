"""Shared by Table 17 and Figure 1: the MoR runs with per-token depths, and their tokenizer."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mor.config import run_config_from_dict
from mor.data.paths import data_paths
from mor.data.tokenizer import load_tokenizer
from mor.results import config_of


def depth_runs(df: pd.DataFrame) -> list[dict]:
    """MoR rows with sample tokens and depths, Nr then run id order."""
    have = df[(df["variant"] == "mor") & df["sample_token_ids"].notna()]
    rows = [r for r in have.sort_values(["num_recursions", "run_id"]).to_dict("records")
            if r["sample_token_ids"] is not None and len(r["sample_token_ids"])]
    if not rows:
        raise ValueError("no MoR run with per-token recursion depths (sample_token_ids / sample_token_depths)")
    return rows


def decoder(row: dict, data_root: Path):
    """The run's tokenizer's decode (ids -> text)."""
    cfg = run_config_from_dict(config_of(row))
    return load_tokenizer(data_paths(cfg.data, Path(data_root)).tokenizer).decode


def seq_len(row: dict) -> int:
    return int(config_of(row)["train"]["seq_len"])
