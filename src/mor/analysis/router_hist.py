"""Router output histograms (Fig. 5b) as bars: the eval job stores, per recursion, the
normalised counts of router outputs of selected and unselected candidates over shared bin
edges (``mor.metrics.routing.router_output_histogram``, column ``router_output_hist``)."""

from __future__ import annotations

import json

import numpy as np


def histogram_bars(hist: dict) -> dict[str, np.ndarray]:
    """{'left', 'width', 'center', 'selected', 'unselected'} arrays, one entry per bin."""
    edges = np.asarray(hist["bin_edges"], dtype=np.float64)
    sel, uns = np.asarray(hist["selected"], dtype=np.float64), np.asarray(hist["unselected"], dtype=np.float64)
    if len(edges) != len(sel) + 1 or len(sel) != len(uns):
        raise ValueError(f"{len(edges)} bin edges for {len(sel)} selected / {len(uns)} unselected counts")
    return {"left": edges[:-1], "width": np.diff(edges), "center": (edges[:-1] + edges[1:]) / 2,
            "selected": sel, "unselected": uns}


def per_recursion(column: str | None) -> list[dict]:
    """The ``router_output_hist`` column (JSON) -> one histogram dict per recursion ([] if null)."""
    return json.loads(column) if column else []
