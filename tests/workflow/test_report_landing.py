"""The report opens on the results: the landing text (claims first, then the training curves,
then the paper's sections) and the landing-page metadata that makes Snakemake's report show it
instead of the DAG; both checked in a real report of a tiny table10 workflow (slow). What a
reader SEES on that page (no metadata dump, the title at the top) is read in a real browser by
tests/cluster/test_report_browser.py (opt-in: MOR_TESTS=browser)."""

from __future__ import annotations

import json
import re

import pytest

from helpers.paths import REPO
from mor.reports.landing import CLAIMS_CATEGORY, CURVES_CATEGORY, landing_rst


def _html(rst: str) -> str:
    from docutils.core import publish_parts

    return publish_parts(rst, writer="html", settings_overrides={"report_level": 2, "halt_level": 2})["html_body"]


def test_the_landing_text_puts_the_claims_and_curves_before_the_sections(tmp_path):
    claims = tmp_path / "claims.csv"
    claims.write_text("claim,verdict\nmiddle-cycle-safest,holds\nsharing-costs,not built\ncompute,contradicted\n"
                      "kv-share,inconclusive\n")
    sections = ["App. F Parameter sharing", "5.1 Compute-optimal scaling (isoFLOP)"]
    rst = landing_rst([*sections, CURVES_CATEGORY, CLAIMS_CATEGORY], claims, commit="abc")
    assert "1 holds, 1 contradicted, 1 inconclusive, 1 not built" in rst
    assert "- middle-cycle-safest: holds" in rst and "- compute: contradicted" in rst and "kv-share:" not in rst
    link = lambda n: rst.index(f"`{n}`_") if f"`{n}`_" in rst else rst.index(f"<{n}_>")  # noqa: E731  plain or aliased
    order = [link(n) for n in (CLAIMS_CATEGORY, CURVES_CATEGORY, *sorted(sections))]
    assert order == sorted(order)
    # Snakemake appends one link target per category, Workflow and Statistics; with them it is valid rst
    targets = "\n".join(f".. _{n}: javascript:app.showCategory('x')" for n in
                        [*sections, CURVES_CATEGORY, CLAIMS_CATEGORY, "Workflow", "Statistics"])
    html = _html(rst + "\n" + targets + "\n")
    assert html.count("javascript:app.showCategory") == 6 and "system-message" not in html
    assert "see the claims table" in landing_rst([CLAIMS_CATEGORY], tmp_path / "none.csv", "abc")  # before it is built


def test_both_profiles_pass_the_landing_metadata_and_it_holds_numbers_only(tmp_path, monkeypatch):
    """Snakemake 9.27 renders a string metadata value with docutils' publish_parts and the page
    shows the whole dict of parts ("WHOLE ... ENCODING utf-8 ERRORS strict VERSION 0.22.4"):
    every value is a number, and the counts are the grids and runs with results."""
    import yaml
    import yte

    for profile in ("local", "slurm"):
        value = yaml.safe_load((REPO / profile / "config.yaml").read_text())["report-metadata"]
        assert (REPO / profile / value).resolve() == REPO / "workflows" / "report" / "metadata.yaml"
    import mor.reports.landing as landing

    monkeypatch.setattr(landing, "_SHOWN", None)  # no landing text rendered: every grid with results
    _results(tmp_path, {"a": 3, "b": 1})
    monkeypatch.chdir(tmp_path)  # Snakemake renders it in the workflow's directory
    with open(REPO / "workflows" / "report" / "metadata.yaml") as f:
        meta = yte.process_yaml(f)
    assert meta == {"Grids shown": 2, "Runs shown": 4}
    assert all(type(v) in (int, float) for v in meta.values())


def _results(root, runs: dict[str, int]) -> None:
    """results/<grid>.parquet with that many rows (a grid's results table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "results").mkdir(parents=True, exist_ok=True)
    for grid, n in runs.items():
        pq.write_table(pa.table({"run_id": [f"r{i}" for i in range(n)]}), root / "results" / f"{grid}.parquet")


def test_the_counts_are_of_what_the_report_shows(tmp_path, monkeypatch):
    """Issue 57: the first screen said 2 grids / 24 runs beside a report of Table 10 (1 / 22). The
    landing text counts the grids among the report's files (tables, figures, training curves) and
    their results rows, says them, and the metadata (rendered after it) repeats them."""
    import yte

    import mor.reports.landing as landing

    monkeypatch.setattr(landing, "_SHOWN", None)
    _results(tmp_path, {"table10": 22, "table15": 2})  # table15 has results but is not in this report
    monkeypatch.chdir(tmp_path)
    files = ["tables/table10/table10.html", "figures/fig6/fig6.png", "figures/curves/table10/loss.png",
             "tables/claims/claims.html"]
    grid_of = {"tables/table10": "table10", "figures/fig6": "table10", "tables/table15": "table15"}
    rst = landing_rst([CURVES_CATEGORY], tmp_path / "none.csv", commit="abc", files=files, artifact_grid=grid_of)
    assert "**Shown here:** 1 grid(s), 22 runs: table10 (22)." in rst
    with open(REPO / "workflows" / "report" / "metadata.yaml") as f:
        assert yte.process_yaml(f) == {"Grids shown": 1, "Runs shown": 22}
    landing_rst([CURVES_CATEGORY], tmp_path / "none.csv", commit="abc", files=files + ["tables/table15/t.html"],
                artifact_grid=grid_of)
    assert landing.report_counts() == {"Grids shown": 2, "Runs shown": 24}


def test_the_landing_text_shows_category_names_without_the_menus_sort_prefix(tmp_path):
    rst = landing_rst([CURVES_CATEGORY, CLAIMS_CATEGORY, "5.1 Compute-optimal scaling (isoFLOP)"], tmp_path / "none.csv",
                      commit="abc")
    targets = "\n".join(f".. _{n}: javascript:app.showCategory('x')" for n in
                        [CURVES_CATEGORY, CLAIMS_CATEGORY, "5.1 Compute-optimal scaling (isoFLOP)", "Workflow", "Statistics"])
    html = _html(rst + "\n" + targets + "\n")
    assert ">Training curves</a>" in html and ">The paper's claims, checked</a>" in html
    assert CURVES_CATEGORY not in html and CLAIMS_CATEGORY not in html  # the prefix: the menu's order only
    assert ">5.1 Compute-optimal scaling (isoFLOP)</a>" in html  # a paper section keeps its number


def test_the_landing_text_names_the_commit_and_top_aligns_the_page(tmp_path):
    rst = landing_rst([CURVES_CATEGORY], tmp_path / "none.csv", commit="0123abc-dirty")
    html = _html(rst + "\n.. _1 Training curves: javascript:app.showCategory('x')\n"
                 ".. _Workflow: x\n.. _Statistics: y\n")
    assert "0123abc-dirty" in html and "system-message" not in html
    # the style that lifts the title to the top reaches the page as raw HTML, scoped to the landing view
    # and lets the text take the page's width (Snakemake's column, max-w-lg, left ~45 % of it blank)
    assert ("<style>div.items-center.h-screen.overflow-auto:has(.mor-landing){align-items:flex-start;"
            "justify-content:flex-start}div.prose:has(.mor-landing),ul:has(>div.prose .mor-landing)"
            "{max-width:none;width:100%}</style>") in html
    assert 'class="mor-landing"' in html


def _js_value(html: str, name: str):
    """A JSON value the report's page assigns (``var NAME = ...;``)."""
    found = re.findall(rf"^\s*var {name} = (.+);\s*$", html, re.M)  # the page's own, after any library's
    assert found, f"no {name} in the report"
    return json.loads(found[-1])


@pytest.mark.slow
def test_the_report_opens_on_the_results(tmp_path, data_root):
    """table10's tiny workflow, --report through the local profile: the page carries landing
    metadata (with it, the report's app starts on the landing view, not the rule graph) and
    the landing text; table10 alone builds no claims table, so the training curves come first
    in it and in the menu, then the paper's section."""
    from helpers.report_page import GRID
    from helpers.workflow import snakemake

    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "table10.yaml").write_text(GRID)
    report = tmp_path / "report.html"
    config = ["--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}"]
    snakemake("tables/table10", *config)
    # the report after the run: Snakemake 9.27's --report-after-run drops --report-metadata (then it opens on the DAG)
    snakemake("tables/table10", "--report", str(report), *config)
    html = report.read_text()
    metadata, categories = _js_value(html, "metadata"), _js_value(html, "categories")
    # numbers, shown as they are (a string would be docutils' dict of parts; the browser test reads the page)
    assert metadata == {"Grids shown": 1, "Runs shown": 6}
    assert sorted(categories) == [CURVES_CATEGORY, "App. F Parameter sharing"]
    assert list(categories[CURVES_CATEGORY]) == ["figures/curves/table10"]
    desc = _js_value(html, "workflow_desc")
    assert "Mixture-of-Recursions, reproduced" in desc
    assert "Shown here:</strong> 1 grid(s), 6 runs: table10 (6)." in desc
    assert desc.index("Training curves") < desc.index("App. F Parameter sharing")
