"""Tables and figures, each drawn from a grid's results parquet alone.

Layer: reports, beside the pipeline. They import parquet readers (``mor.results``), pure
metric, FLOPs and analysis functions, the analysis files' format (``mor.analysis.sidecar``)
and their own helpers; never a job, the trainer or the launcher.

``RENDERERS`` maps an artifact path (as listed under a grid's ``artifacts:``) to the
function that draws it; adding a table = one module here + one entry.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from mor.analysis.sidecar import TOKENIZER_ARTIFACTS
from mor.reports import fig1, fig4a, fig4b, fig5a, fig5b, fig5c, fig6, fig7, real_weights, table9, table10, table17
from mor.reports.ablation import SPECS, render_ablation

RENDERERS = {
    "tables/table9": table9.render,
    "figures/fig5a": fig5a.render,
    "tables/table10": table10.render,
    "figures/fig4a": fig4a.render_figure,
    "tables/fig4a": fig4a.render_table,
    "figures/fig4b": fig4b.render,
    "figures/fig6": fig6.render,
    **{f"tables/{name}": partial(render_ablation, spec) for name, spec in SPECS.items()},
    "figures/fig1": fig1.render,
    "figures/fig5b": fig5b.render,
    "figures/fig5c": fig5c.render,
    "figures/fig7": fig7.render_fig7,
    "figures/fig8": fig7.render_fig8,
    "tables/table17": table17.render,
    "tables/real_weights": real_weights.render,
}


def render(artifact: str, results: str, grid: str, mode: str = "local", data_root: str = "data") -> list[Path]:
    if artifact not in RENDERERS:
        raise KeyError(f"no renderer for {artifact!r}; known: {sorted(RENDERERS)}")
    kw = {"data_root": Path(data_root)} if artifact in TOKENIZER_ARTIFACTS else {}  # decodes with the run's tokenizer
    return RENDERERS[artifact](Path(results), Path(grid), Path(artifact), mode, **kw)
