"""Shared report helpers: load a grid's results, attach the paper's numbers, write atomically."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import yaml

from mor.atomic import remove_stale, replace_dir, temp_sibling
from mor.results import read_frame

TYING_NAMES = {"cycle": "Cycle", "sequence": "Sequence", "middle_cycle": "Middle-Cycle",
               "middle_sequence": "Middle-Sequence"}
REF_KEYS = ("paper_scale", "variant", "tying", "num_recursions", "reduced")


def load_results(results: Path, grid: Path) -> tuple[pd.DataFrame, list[dict]]:
    """Results frame plus the grid's reference rows (the paper's published numbers)."""
    df = read_frame(results)
    if df.empty:
        raise ValueError(f"{results} holds no runs")
    ref = yaml.safe_load(Path(grid).read_text()).get("reference", [])
    return df, ref


def reference_value(ref: list[dict], row: pd.Series, metric: str) -> float | None:
    for r in ref:
        if metric in r and all(r.get(k, _default(k)) == _norm(row.get(k), k) for k in REF_KEYS):
            return float(r[metric])
    return None


def _default(key):
    return False if key == "reduced" else None


def _norm(value, key):
    if key == "reduced":
        return bool(value)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    return int(value) if key == "num_recursions" else value


class OutputDir:
    """Write into a hidden temporary folder and swap it in on success: readers see the old
    artifact or the whole new one, never half of one (``mor.atomic.replace_dir``)."""

    def __init__(self, final: Path):
        self.final = Path(final)
        self.tmp = temp_sibling(self.final)

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.final.parent)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            replace_dir(self.tmp, self.final)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def files(self) -> list[Path]:
        return sorted(self.final.iterdir())
