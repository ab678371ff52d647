"""Tables and figures, each drawn from a grid's results parquet alone.

Layer: reports, beside the pipeline. They import parquet readers (``mor.results``), pure
metric, FLOPs and analysis functions, the analysis files' format (``mor.analysis.sidecar``)
and their own helpers; never a job, the trainer or the launcher.

``RENDERERS`` maps an artifact path (as listed under a grid's ``artifacts:``) to the
function that draws it; adding a table = one module here + one entry.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from mor.analysis.sidecar import TOKENIZER_ARTIFACTS

# Which function draws each artifact, as "module:function" names resolved only when one is
# drawn: every Snakemake parse imports this package (for the report's captions), and importing
# the figure modules eagerly pulled in matplotlib and scipy on every dry run (~1.1 s on
# an idle machine, several seconds on a loaded one). The ablation tables are one function
# (mor.reports.ablation.render_ablation) with the spec of that name (ablation.SPECS; the names
# are listed here so the keys need no import, and tests/unit/test_reports.py checks they match).
ABLATIONS = ("deciding", "table3", "table11", "table12", "table13", "table14", "table15", "table16")
RENDERERS = {
    "tables/table9": "table9:render",
    "figures/fig5a": "fig5a:render",
    "tables/table10": "table10:render",
    "figures/fig4a": "fig4a:render_figure",
    "tables/fig4a": "fig4a:render_table",
    "figures/fig4b": "fig4b:render",
    "figures/fig6": "fig6:render",
    **{f"tables/{name}": "ablation:render_ablation" for name in ABLATIONS},
    "figures/fig1": "fig1:render",
    "figures/fig5b": "fig5b:render",
    "figures/fig5c": "fig5c:render",
    "figures/fig7": "fig7:render_fig7",
    "figures/fig8": "fig7:render_fig8",
    "tables/table17": "table17:render",
    "tables/real_weights": "real_weights:render",
}


def renderer(artifact: str):
    """The function that draws ``artifact`` (its module imported now)."""
    if artifact not in RENDERERS:
        raise KeyError(f"no renderer for {artifact!r}; known: {sorted(RENDERERS)}")
    module, function = RENDERERS[artifact].split(":")
    fn = getattr(import_module(f"mor.reports.{module}"), function)
    if module == "ablation":
        from functools import partial

        return partial(fn, import_module("mor.reports.ablation").SPECS[artifact.split("/", 1)[1]])
    return fn


def render(artifact: str, results: str, grid: str, mode: str = "local", data_root: str = "data") -> list[Path]:
    draw = renderer(artifact)
    kw = {"data_root": Path(data_root)} if artifact in TOKENIZER_ARTIFACTS else {}  # decodes with the run's tokenizer
    return draw(Path(results), Path(grid), Path(artifact), mode, **kw)
