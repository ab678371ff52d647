"""The report the browser tests open: its tiny grid (two seeds, named table10 so the tying
claims apply), Chromium when asked for (MOR_TESTS), and the page queries a reader's clicks
are made of (NAME is replaced by what to find)."""

from __future__ import annotations

import os

import pytest

from helpers.workflow import E2E_GRID


# tiny runs, two seeds (claims get an interval), named table10 (the tying claims apply)
GRID = (E2E_GRID.replace("name: e2e", "name: table10").replace("[middle_cycle]", "[middle_cycle, sequence]")
        .replace("    scale_map: {135M: tiny}\n", "    scale_map: {135M: tiny}\n    seeds: 2\n"))


def browser_tests_enabled() -> bool:
    names = {n.strip().lower() for n in os.environ.get("MOR_TESTS", "").split(",")}
    return bool(names & {"all", "browser"})


def chromium() -> str:
    """Chromium's executable; skips when not asked for, fails (never skips) when asked for and absent."""
    if not browser_tests_enabled():
        pytest.skip("browser tests are opt-in (as root they apt-get install chromium): "
                    "MOR_TESTS=all bash scripts/test.sh (or MOR_TESTS=browser)")
    from helpers.browser import find_chromium

    try:
        return find_chromium()
    except RuntimeError as e:
        pytest.fail(f"MOR_TESTS asks for the browser tests, but Chromium cannot be had: {e}", pytrace=False)


SHARING, CLAIMS_CATEGORY, CURVES_CATEGORY = "App. F Parameter sharing", "0 The paper's claims, checked", "1 Training curves"

LANDING_TITLE = "Mixture-of-Recursions, reproduced"  # mor.reports.landing

# the top (px from the window's top) of the shown heading whose text is NAME; null while none is shown
TITLE_TOP = ("(() => { const h = [...document.querySelectorAll('h1')].find(h => h.innerText.replace(/\\s+/g, ' ') == `NAME`);"
             " return h ? h.getBoundingClientRect().top : null; })()")
# a navigation link whose text is NAME is shown
LINK = "[...document.querySelectorAll('a')].some(a => a.innerText.trim() == `NAME`)"
# a result row that names the file NAME, with its view button, is shown
ROW = "[...document.querySelectorAll('tr')].some(t => t.innerText.includes('NAME') && t.querySelector('a'))"
# the PNG images the page shows, once the browser has decoded them
DECODED_PNGS = "[...document.images].filter(i => i.src.startsWith('data:image/png') && i.complete && i.naturalWidth > 0)"
# click the navigation link whose text is NAME, as a reader would
CLICK = ("(() => { [...document.querySelectorAll('a')].find(a => a.innerText.trim() == `NAME`).click(); "
         "return true; })()")
# click the "view" icon of the result row whose file is NAME (the report's own button)
VIEW = ("(() => { const tr = [...document.querySelectorAll('tr')].find(t => t.innerText.includes('NAME'));"
        " tr.querySelector('a').click(); return true; })()")
