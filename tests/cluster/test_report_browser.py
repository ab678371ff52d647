"""The Snakemake report of the `paper` target, opened in a real headless Chromium.

A tiny grid named `table10` (so the claims about tying schemes apply to it; two seeds, so
they get an interval) is built with `snakemake paper`, then the report as the README says
(`snakemake paper --report report.html`, through the local profile and so with its landing
metadata). Chromium then loads the report and we read it as a reader would, over the DevTools
protocol (tests/helpers/browser.py): the first screen's visible text (the landing page: its
title at the top, no docutils metadata dump), then open the claims category, view claims.html
(the report shows it in an iframe: we count its rendered table rows and read its verdicts),
then view fig6.png and check the browser decoded it at the PNG's own width. Screenshots of
the three views are written (``MOR_REPORT_SHOT`` = a folder to keep them in).

Opt-in like the Slurm tests (MOR_TESTS=all or a list naming `browser`): as root it
apt-get installs Debian's `chromium` when missing; asked for and without chromium (not
root, or the install fails) it fails with the reason, never skips. Every step waits for
what it needs on the page (a link, a result row, a decoded image, the claims table's rows),
never for a fixed time.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pandas as pd

import pytest

from helpers.report_page import (
    CLAIMS_CATEGORY, CLICK, CURVES_CATEGORY, DECODED_PNGS, GRID, LANDING_TITLE, LINK, ROW, SHARING, TITLE_TOP, VIEW,
    chromium,
)
from helpers.workflow import snakemake

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_paper_report_renders_claims_and_a_figure(tmp_path, data_root):
    browser = chromium()
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "table10.yaml").write_text(GRID)
    report = tmp_path / "report.html"
    config = ["--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}"]
    snakemake("paper", *config)
    # the report as README step 3 builds it (--report-after-run would drop the profile's --report-metadata)
    snakemake("paper", "--report", str(report), *config)
    from helpers.browser import Browser

    from mor.claims import CLAIMS

    claims = pd.read_csv(tmp_path / "tables" / "claims" / "claims.csv")
    png = (tmp_path / "figures" / "fig6" / "fig6.png").read_bytes()
    png_width = struct.unpack(">I", png[16:20])[0]  # IHDR width
    shots = tmp_path / "shots"
    shots.mkdir()

    async def read_report(page):
        await page.open(report.as_uri(), ready=f"typeof categories == 'object' && {LINK.replace('NAME', SHARING)}"
                                               f" && {TITLE_TOP.replace('NAME', LANDING_TITLE)} !== null")
        landing = await page.js("document.body.innerText")  # what a reader sees, not the page's JSON
        title_top = await page.js(TITLE_TOP.replace("NAME", LANDING_TITLE))
        await page.screenshot(shots / "landing.png")
        categories = await page.js("Object.keys(categories)")
        await page.js(CLICK.replace("NAME", SHARING))  # menu -> category
        await page.wait_for(LINK.replace("NAME", "figures/fig6"))
        await page.js(CLICK.replace("NAME", "figures/fig6"))  # -> subcategory
        await page.wait_for(ROW.replace("NAME", "fig6.png"))
        await page.js(VIEW.replace("NAME", "fig6.png"))
        await page.wait_for(DECODED_PNGS + ".length > 0")  # the figure shown and decoded
        widths = await page.js(DECODED_PNGS + ".map(i => i.naturalWidth)")
        await page.screenshot(shots / "fig6.png")
        await page.js("app.setView({navbarMode: 'menu'})")  # the home button
        await page.wait_for(LINK.replace("NAME", CLAIMS_CATEGORY))
        await page.js(CLICK.replace("NAME", CLAIMS_CATEGORY))
        await page.wait_for(ROW.replace("NAME", "claims.html"))
        await page.js(VIEW.replace("NAME", "claims.html"))
        await page.wait_for(f"document.querySelectorAll('table tr').length == {len(CLAIMS) + 1}", frame=0)
        rows = await page.js("[...document.querySelectorAll('table tr')].map(r => [...r.cells].map(c => c.innerText))",
                             frame=0)
        await page.screenshot(shots / "claims.png")
        return landing, title_top, categories, rows, widths

    with Browser(browser) as b:
        landing, title_top, categories, rows, widths = b.run(read_report)
    # the landing page: its title on the first screen, at the top (Snakemake centres the content box
    # vertically: a long page lost its title above the top, a short one had blank space over it)
    assert 0 <= title_top < 100, title_top
    # the metadata as numbers, never docutils' dict of parts ("WHOLE ... ENCODING utf-8 ERRORS strict")
    for junk in ("ENCODING", "ERRORS", "WHOLE", "utf-8", "strict", "VERSION"):
        assert junk not in landing.upper().split(), (junk, landing)
    runs = len(pd.read_parquet(tmp_path / "results" / "table10.parquet"))  # the grid's rows: 3 configs x 2 seeds
    # the counts are those of what the report shows (issue 57): in the text and in the metadata
    assert runs == 6 and f"GRIDS SHOWN\n1\nRUNS SHOWN\n{runs}" in landing.upper(), landing
    assert f"Shown here: 1 grid(s), {runs} runs: table10 ({runs})." in landing, landing
    assert "The paper's claims:" in landing and "Code: commit" in landing
    assert set(categories) == {CLAIMS_CATEGORY, CURVES_CATEGORY, SHARING}  # claims and curves first (mor.reports.landing)
    header, body = rows[0], rows[1:]
    assert len(body) == len(CLAIMS)  # every claim rendered as a table row
    shown = {r[header.index("claim")]: r[header.index("verdict")] for r in body}
    assert shown == dict(zip(claims["claim"], claims["verdict"]))
    # table10 is built; outside the local family (grids/claims/claims.yaml design.family) it is shown untested
    assert shown["middle-cycle-safest"] in ("holds", "contradicted", "inconclusive", "not tested in this mode")
    assert shown["sharing-costs"] == "not built"  # it reads grids/deciding.yaml, not in this workflow
    assert shown["compute"] == "not built"  # no table9 in this workflow
    assert widths == [png_width]  # the figure, decoded by the browser at its own size
    for shot in shots.iterdir():
        assert shot.stat().st_size > 20_000
        if os.environ.get("MOR_REPORT_SHOT"):
            Path(os.environ["MOR_REPORT_SHOT"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(os.environ["MOR_REPORT_SHOT"]) / shot.name)


