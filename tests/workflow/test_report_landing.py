"""The report opens on the results: the landing text (claims first, then the training curves,
then the paper's sections) and the landing-page metadata that makes Snakemake's report show it
instead of the DAG; both checked in a real report of a tiny table10 workflow (slow)."""

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
    rst = landing_rst([*sections, CURVES_CATEGORY, CLAIMS_CATEGORY], claims)
    assert "1 holds, 1 contradicted, 1 inconclusive, 1 not built" in rst
    assert "- middle-cycle-safest: holds" in rst and "- compute: contradicted" in rst and "kv-share:" not in rst
    order = [rst.index(f"`{n}`_") for n in (CLAIMS_CATEGORY, CURVES_CATEGORY, *sorted(sections))]
    assert order == sorted(order)
    # Snakemake appends one link target per category, Workflow and Statistics; with them it is valid rst
    targets = "\n".join(f".. _{n}: javascript:app.showCategory('x')" for n in
                        [*sections, CURVES_CATEGORY, CLAIMS_CATEGORY, "Workflow", "Statistics"])
    html = _html(rst + "\n" + targets + "\n")
    assert html.count("javascript:app.showCategory") == 6 and "system-message" not in html
    assert "see the claims table" in landing_rst([CLAIMS_CATEGORY], tmp_path / "none.csv")  # before it is built


def test_both_profiles_pass_the_landing_metadata_and_it_is_a_flat_mapping():
    import yaml
    import yte

    for profile in ("local", "slurm"):
        value = yaml.safe_load((REPO / profile / "config.yaml").read_text())["report-metadata"]
        assert (REPO / profile / value).resolve() == REPO / "workflows" / "report" / "metadata.yaml"
    with open(REPO / "workflows" / "report" / "metadata.yaml") as f:
        meta = yte.process_yaml(f)
    assert meta and all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in meta.items())
    assert "rev" not in meta["Code"] and re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?|unknown", meta["Code"]), meta


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
    assert "the claims table and the training curves first" in json.dumps(metadata["Results"])  # rendered rst
    assert sorted(categories) == [CURVES_CATEGORY, "App. F Parameter sharing"]
    assert list(categories[CURVES_CATEGORY]) == ["figures/curves/table10"]
    desc = _js_value(html, "workflow_desc")
    assert "Mixture-of-Recursions, reproduced" in desc
    assert desc.index(CURVES_CATEGORY) < desc.index("App. F Parameter sharing")
