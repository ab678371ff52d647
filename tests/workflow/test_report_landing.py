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
    order = [rst.index(f"`{n}`_") for n in (CLAIMS_CATEGORY, CURVES_CATEGORY, *sorted(sections))]
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
    for grid, runs in (("a", 3), ("b", 1)):
        (tmp_path / "results" / "runs" / grid).mkdir(parents=True)
        (tmp_path / "results" / f"{grid}.parquet").write_bytes(b"")
        for i in range(runs):
            (tmp_path / "results" / "runs" / grid / f"r{i}.parquet").write_bytes(b"")
    monkeypatch.chdir(tmp_path)  # Snakemake renders it in the workflow's directory
    with open(REPO / "workflows" / "report" / "metadata.yaml") as f:
        meta = yte.process_yaml(f)
    assert meta == {"Grids with results": 2, "Runs with results": 4}
    assert all(type(v) in (int, float) for v in meta.values())


def test_the_landing_text_names_the_commit_and_top_aligns_the_page(tmp_path):
    rst = landing_rst([CURVES_CATEGORY], tmp_path / "none.csv", commit="0123abc-dirty")
    html = _html(rst + "\n.. _1 Training curves: javascript:app.showCategory('x')\n"
                 ".. _Workflow: x\n.. _Statistics: y\n")
    assert "0123abc-dirty" in html and "system-message" not in html
    # the style that lifts the title to the top reaches the page as raw HTML, scoped to the landing view
    assert "<style>div.items-center.h-screen.overflow-auto:has(.mor-landing){align-items:flex-start}</style>" in html
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
    assert metadata == {"Grids with results": 1, "Runs with results": 6}
    assert sorted(categories) == [CURVES_CATEGORY, "App. F Parameter sharing"]
    assert list(categories[CURVES_CATEGORY]) == ["figures/curves/table10"]
    desc = _js_value(html, "workflow_desc")
    assert "Mixture-of-Recursions, reproduced" in desc
    assert desc.index(CURVES_CATEGORY) < desc.index("App. F Parameter sharing")
