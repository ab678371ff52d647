"""The report's landing page: results first, then how they were made (pure; reads csv only).

Snakemake's HTML report opens on the workflow's DAG unless it has landing-page metadata; then it
opens on the workflow description followed by that metadata. The workflow sets both
(``workflows/report/workflow.rst`` renders ``landing_rst`` here; the profiles pass
``--report-metadata workflows/report/metadata.yaml``), so a reader lands on: what the claims
came to (the verdict counts from ``tables/claims/claims.csv`` and the claims decided either way),
links to the claims table and to the training curves, then the paper's sections, the code's
commit. The DAG stays one click away (Workflow).

Two traps of Snakemake 9.27's landing page, both visible only in a browser:

- A metadata value that is a string is rendered with docutils' ``publish_parts`` and shown as
  the whole dict of parts ("WHOLE ... ENCODING utf-8 ERRORS strict VERSION 0.22.4", per value).
  So the metadata holds numbers only (``report_counts``: shown as they are); all text is here.
- The page centres its content vertically in a screen-high box: a short page gets blank space
  above its title, a long one its title cut off above the top, out of reach of the scrollbar.
  And it holds the text in a ``prose max-w-lg`` column (32rem) centred in that box, which
  left the right ~45 % of the page blank. ``TOP_ALIGN`` (raw HTML in the landing text) aligns
  the box's content to its top left and lets the text take the page's width, while the
  landing page is shown.

Counts (issue 57): the landing page states the grids and runs the report SHOWS, never those
that merely have results on disk (a report of Table 10 said 2 grids / 24 runs beside the 1 / 22
it showed). Snakemake renders the landing text (``landing_rst``, given the report's files)
before the metadata (``report_counts``), so the text records what it counted and the metadata
repeats it. Menu names keep their sort prefix ("1 Training curves", so the menu lists them
first); the landing text shows them without it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mor.reports.captions import section

CLAIMS_CATEGORY = section("tables/claims")  # "0 The paper's claims, checked": sorts first in the menu
CURVES_CATEGORY = "1 Training curves"  # second, before the paper's sections ("5.1 ...", "App. ...")
# the report's content box (Snakemake's template: "grow flex items-center justify-center h-screen
# overflow-auto") aligned to the top while the landing text, which carries this style, is shown
TOP_ALIGN = (".. raw:: html\n\n   <style>div.items-center.h-screen.overflow-auto:has(.mor-landing)"
             "{align-items:flex-start;justify-content:flex-start}"
             "div.prose:has(.mor-landing),ul:has(>div.prose .mor-landing){max-width:none;width:100%}</style>"
             "<span class=\"mor-landing\"></span>\n")
VERDICTS = ("holds", "contradicted", "inconclusive", "not tested in this mode", "not built")


def claims_summary(claims_csv: Path) -> tuple[str, list[str]]:
    """("3 holds, 1 contradicted, ...", the decided claims as "claim: verdict") from the claims
    table; ("", []) before it is built."""
    try:
        table = pd.read_csv(claims_csv)
    except (OSError, ValueError):
        return "", []
    if "verdict" not in table or "claim" not in table:
        return "", []
    counts = table["verdict"].value_counts().to_dict()
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS
                        if v != "not tested in this mode" or counts.get(v))  # claims outside the mode's family
    decided = [f"{r['claim']}: {r['verdict']}" for _, r in table.iterrows() if r["verdict"] in ("holds", "contradicted")]
    return summary, decided


_SHOWN: dict[str, int] | None = None  # what the last landing text counted (report_counts repeats it)


def shown_grids(files: list[str], artifact_grid: dict[str, str]) -> list[str]:
    """The grids whose tables, figures or training curves are among a report's ``files``
    (paths such as tables/table10/table10.html, figures/curves/table10/loss.png); the claims
    table, which reads several grids' verdicts, adds none. Sorted."""
    grids = set()
    for f in files:
        parts = Path(f).parts
        if len(parts) >= 3 and parts[:2] == ("figures", "curves"):
            grids.add(parts[2])
        elif len(parts) >= 2 and f"{parts[0]}/{parts[1]}" in artifact_grid:
            grids.add(artifact_grid[f"{parts[0]}/{parts[1]}"])
    return sorted(grids)


def grid_runs(grid: str, root: Path = Path(".")) -> int:
    """Rows of a grid's results table (results/<grid>.parquet), the runs its tables are drawn
    from; 0 when it has none. Reads the parquet footer only."""
    import pyarrow.parquet as pq

    from mor.layout import GRID_RESULTS_PATTERN

    path = root / GRID_RESULTS_PATTERN.format(grid=grid)
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, ValueError):
        return 0


def shown_counts(files: list[str], artifact_grid: dict[str, str], root: Path = Path(".")) -> dict[str, int]:
    """{'Grids shown': n, 'Runs shown': m}: the grids among the report's files and their runs."""
    grids = shown_grids(files, artifact_grid)
    return {"Grids shown": len(grids), "Runs shown": sum(grid_runs(g, root) for g in grids)}


def report_counts(root: Path = Path(".")) -> dict[str, int]:
    """The landing page's metadata (workflows/report/metadata.yaml): numbers only, as the
    module docstring says why. The counts the landing text made of what the report shows
    (Snakemake renders it first); outside a report (no landing text yet) every grid with a
    results table, as if all were shown."""
    if _SHOWN is not None:
        return dict(_SHOWN)
    grids = sorted(p.stem for p in (root / "results").glob("*.parquet"))
    return {"Grids shown": len(grids), "Runs shown": sum(grid_runs(g, root) for g in grids)}


def display_name(name: str) -> str:
    """A category's name as the landing text shows it: the menu's sort prefix ('1 ' of
    '1 Training curves') dropped; a paper section's number ('5.1 ...') is kept."""
    return name.split(" ", 1)[1] if name in (CLAIMS_CATEGORY, CURVES_CATEGORY) and " " in name else name


def _link(name: str) -> str:
    """An rst reference to a report category (Snakemake defines one target per category name),
    shown under its display name (an embedded alias where the two differ)."""
    shown = display_name(name)
    return f"`{name}`_" if shown == name else f"`{shown} <{name}_>`_"


def landing_rst(categories: list[str], claims_csv: Path = Path("tables/claims/claims.csv"), commit: str | None = None,
                files: list[str] | None = None, artifact_grid: dict[str, str] | None = None, root: Path = Path(".")) -> str:
    """The landing page's text (reStructuredText) for the report's ``categories`` (names) and
    ``files`` (the paths it shows; with ``artifact_grid``, artifact -> grid, the grids and runs
    shown are counted, stated and kept for ``report_counts``); ``commit``: the code's
    (``mor.provenance.git_commit()`` when None)."""
    global _SHOWN
    if commit is None:
        from mor.provenance import git_commit

        commit = git_commit()
    names = sorted(categories)
    lines = ["Mixture-of-Recursions, reproduced", "=" * 33, "", TOP_ALIGN]
    if files is not None:
        grids = shown_grids(files, artifact_grid or {})
        _SHOWN = shown_counts(files, artifact_grid or {}, root)
        runs = ", ".join(f"{g} ({grid_runs(g, root)})" for g in grids)
        lines += [f"**Shown here:** {_SHOWN['Grids shown']} grid(s), {_SHOWN['Runs shown']} runs"
                  + (f": {runs}." if runs else "."), ""]
    summary, decided = claims_summary(claims_csv)
    if summary:
        lines += [f"**The paper's claims:** {summary} (after Holm).", ""]
        lines += [f"- {d}" for d in decided] + ([""] if decided else [])
    elif CLAIMS_CATEGORY in names:
        lines += ["**The paper's claims:** see the claims table.", ""]
    start = [n for n in (CLAIMS_CATEGORY, CURVES_CATEGORY) if n in names]
    if start:
        lines += ["Start here: " + ", then ".join(_link(n) for n in start) + ".", ""]
    sections = [n for n in names if n not in start]
    if sections:
        lines += ["The paper's sections:", ""] + [f"- {_link(n)}" for n in sections] + [""]
    lines += ["Every table and figure is redrawn from the runs' parquet; the workflow that made them (its DAG, "
              f"rules and run times) is under `Workflow`_ and `Statistics`_. Code: commit ``{commit}``.", ""]
    return "\n".join(lines)
