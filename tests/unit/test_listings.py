"""Which listing a shared run's own jobs read (``mor.listings``, issue 58): an eval job is one per
distinct eval settings and reads a listing with those settings; an analysis job reads a grid that
draws it, and only the grids that draw it must agree on its settings; lm-eval settings must agree
among the grids that score tasks."""

from __future__ import annotations

import pytest
from helpers.workflow import E2E_GRID

from mor.grids import GridError, load_grid
from mor.listings import check_agree, home, home_of, listings

MODES = ("lmeval", "analysis")  # what the workflow checks (workflows/rules/common.smk)


def grid(tmp_path, name: str, artifacts: str = "[]", eval_set: str = "{nll_tokens: 2048, batch: 8}"):
    text = (E2E_GRID.replace("name: e2e", f"name: {name}")
            .replace("artifacts: [tables/table10, figures/fig6]", f"artifacts: {artifacts}")
            .replace("eval: {nll_tokens: 2048, batch: 8}", f"eval: {eval_set}"))
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_grid(path, "local")


def test_an_eval_reads_the_first_listing_with_its_eval_settings(tmp_path):
    a, b, c = grid(tmp_path, "ga"), grid(tmp_path, "gb", eval_set="{nll_tokens: 1024, batch: 8}"), grid(tmp_path, "gc")
    by_id = listings([c, b, a])
    rid = a.runs[0].run_id
    assert [x.grid for x in by_id[rid]] == ["ga", "gb", "gc"]  # one run id, three listings, by grid name
    ha, hb = a.run(rid).config.eval_hash, b.run(rid).config.eval_hash
    assert ha != hb and c.run(rid).config.eval_hash == ha
    assert home(by_id[rid], "eval", hb).grid == "gb" and home(by_id[rid], "eval", ha).grid == "ga"
    grids = {g.name: g for g in (a, b, c)}
    assert home_of(grids, by_id, rid, "eval", hb)[0].name == "gb"
    with pytest.raises(GridError, match="no grid lists it with eval settings 000000000000"):
        home(by_id[rid], "eval", "000000000000")
    check_agree(by_id, "local", MODES)  # differing eval settings are two evals, never refused


def test_an_analysis_is_refused_only_where_the_grids_that_draw_it_disagree(tmp_path):
    draws = grid(tmp_path, "ga", artifacts="[figures/fig5c]")  # depth caps of its recursive run
    other = grid(tmp_path, "gb", eval_set="{nll_tokens: 1024, batch: 8}")  # draws nothing: free to score otherwise
    by_id = listings([draws, other])
    rec = next(r.run_id for r in draws.runs if r.config.model.variant == "recursive")
    assert [x.analyses for x in by_id[rec]] == [("depth_cap",), ()]
    assert home(by_id[rec], "analysis", "depth_cap").grid == "ga"
    check_agree(by_id, "local", MODES)
    also = grid(tmp_path, "gd", artifacts="[figures/fig5c]", eval_set="{nll_tokens: 1024, batch: 8}")
    with pytest.raises(GridError, match=r"grids ga and gd list it with different analysis \(depth_cap\) settings"):
        check_agree(listings([draws, other, also]), "local", MODES)
