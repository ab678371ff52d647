"""Selecting runs from a grid's results frame: by column or by a dotted config key."""

from __future__ import annotations

import json
import math
from functools import lru_cache

import numpy as np
import pandas as pd


def seeds_of(frames: dict[str, pd.DataFrame], grids: tuple[str, ...]) -> list[int]:
    """Seeds present in every grid a claim needs, ascending (the order seeds are added)."""
    sets = [set(int(s) for s in frames[g]["seed"]) for g in grids]
    return sorted(set.intersection(*sets)) if sets else []


@lru_cache(maxsize=4096)
def _parsed(config_json: str) -> dict:
    return json.loads(config_json)  # read-only below: the cache hands out one dict per string


@lru_cache(maxsize=65536)
def _lookup(config_json: str, dotted: str):  # cached: a str caches its hash, so a hit costs a dict lookup
    node = _parsed(config_json)
    for k in dotted.split("."):
        node = node.get(k) if isinstance(node, dict) else None
    return node


def cfg(row, dotted: str):
    """The value of a dotted config key (``model.router.aux``) in a row's config_json."""
    return _lookup(row["config_json"], dotted)


def _mask(df: pd.DataFrame, where: dict) -> np.ndarray:
    """Which rows match every column == value (see ``pick``), as a boolean array."""
    mask, configs = np.ones(len(df), dtype=bool), None
    for key, value in where.items():
        key = key.replace("__", ".")
        if key in df.columns:
            values = df[key].tolist()
        else:
            configs = df["config_json"].tolist() if configs is None else configs
            values = [_lookup(j, key) for j in configs]
        mask &= np.fromiter((bool(v == value) for v in values), dtype=bool, count=len(values))
    return mask


def rows(df: pd.DataFrame, **where) -> np.ndarray:
    """The positions of the rows matching every column == value (``pick``'s rule), no copy."""
    return np.flatnonzero(_mask(df, where))


def pick(df: pd.DataFrame, **where) -> pd.DataFrame:
    """Rows matching every column == value (a column of the frame or a dotted config key,
    written with ``__`` for the dots). Compared value by value in Python (``v == value``), as
    the predicates need for None, lists and strings; on plain lists, since pandas' per-element
    ``map`` made this the hot loop of every verdict (benchmarks/bench_claims_null.py)."""
    return df.iloc[np.flatnonzero(_mask(df, where))]


def one(df: pd.DataFrame, metric: str = "val_nll", **where) -> float:
    """The metric of the single run matching ``where`` (nan when none)."""
    rows = np.flatnonzero(_mask(df, where))
    if len(rows) == 0:
        return math.nan
    if len(rows) > 1:
        raise ValueError(f"{len(rows)} runs match {where}; a claim must name one run per seed")
    return float(df[metric].iloc[rows[0]])


def scale_key(s: str) -> float:
    """Parameters a paper scale name stands for ('135M' < '1.7B'); unknown names last."""
    try:
        return float(s[:-1]) * {"M": 1e6, "B": 1e9}.get(s[-1], 1)
    except ValueError:
        return float("inf")
