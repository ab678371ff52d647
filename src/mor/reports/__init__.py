"""Tables and figures, each drawn from a grid's results parquet alone.

``RENDERERS`` maps an artifact path (as listed under a grid's ``artifacts:``) to the
function that draws it; adding a table = one module here + one entry.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from mor.reports import fig6, table10
from mor.reports.ablation import SPECS, render_ablation

RENDERERS = {
    "tables/table10": table10.render,
    "figures/fig6": fig6.render,
    **{f"tables/{name}": partial(render_ablation, spec) for name, spec in SPECS.items()},
}


def render(artifact: str, results: str, grid: str, mode: str = "local") -> list[Path]:
    if artifact not in RENDERERS:
        raise KeyError(f"no renderer for {artifact!r}; known: {sorted(RENDERERS)}")
    return RENDERERS[artifact](Path(results), Path(grid), Path(artifact), mode)
