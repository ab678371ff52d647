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
  ``TOP_ALIGN`` (raw HTML in the landing text) aligns that box's content to its top while the
  landing page is shown.
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
             "{align-items:flex-start}</style><span class=\"mor-landing\"></span>\n")
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


def report_counts(root: Path = Path(".")) -> dict[str, int]:
    """The landing page's metadata (workflows/report/metadata.yaml): numbers only, as the
    module docstring says why. Grids with a results table, and runs with a results row."""
    return {"Grids with results": len(list((root / "results").glob("*.parquet"))),
            "Runs with results": len(list((root / "results" / "runs").glob("*/*.parquet")))}


def _link(name: str) -> str:
    """An rst reference to a report category (Snakemake defines one target per category name)."""
    return f"`{name}`_"


def landing_rst(categories: list[str], claims_csv: Path = Path("tables/claims/claims.csv"),
                commit: str | None = None) -> str:
    """The landing page's text (reStructuredText) for the report's ``categories`` (names);
    ``commit``: the code's (``mor.provenance.git_commit()`` when None)."""
    if commit is None:
        from mor.provenance import git_commit

        commit = git_commit()
    names = sorted(categories)
    lines = ["Mixture-of-Recursions, reproduced", "=" * 33, "", TOP_ALIGN]
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
