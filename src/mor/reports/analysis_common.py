"""Helpers of the reports that draw analysis files (``mor.analysis.job``) beside the parquet."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mor.analysis.sidecar import applies, read_sidecar, sidecar_path
from mor.config import run_config_from_dict
from mor.reports.common import TYING_NAMES
from mor.results import config_of


def runs_with(df: pd.DataFrame, analysis: str) -> pd.DataFrame:
    """The rows of ``df`` the analysis applies to (by each row's resolved config)."""
    keep = [applies(analysis, run_config_from_dict(config_of(r))) for r in df.to_dict("records")]
    return df[keep]


def load_sidecar(results: Path, row: pd.Series | dict, analysis: str) -> tuple[dict, dict]:
    """(meta, arrays) of a row's analysis file: results/runs/<run_id>.<analysis>.npz,
    beside the per-run parquet of ``results`` (results/<grid>.parquet)."""
    path = sidecar_path(Path(results).parent, row["run_id"], analysis)
    return read_sidecar(path, run_id=row["run_id"], config_hash=row["config_hash"])


def run_title(row: pd.Series | dict) -> str:
    variant = {"mor": "MoR", "recursive": "Recursive", "vanilla": "Vanilla"}.get(row["variant"], row["variant"])
    tying = row.get("tying")
    tie = f" {TYING_NAMES.get(tying, tying)}" if isinstance(tying, str) else ""
    return f"{variant}{tie} Nr={int(row['num_recursions'])} ({row['paper_scale']} as {row['scale']})"
