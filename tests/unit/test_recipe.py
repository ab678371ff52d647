"""The recipe (mor.recipe): every cluster run that stands for one of the authors' released 360M
runs agrees with its config (grids/authors/released.yaml) or carries a recorded reason; table3
stands for all nine."""

from __future__ import annotations

import dataclasses

import pytest

from mor.authors import load_released
from mor.grids import all_grids, grid_path, load_grid
from mor.recipe import format_recipe, recipe, run_recipe, unexplained


@pytest.mark.parametrize("path", all_grids(), ids=lambda p: p.stem)
def test_no_cluster_grid_differs_from_the_released_configs_without_a_reason(path):
    settings = recipe(load_grid(path, "cluster"))
    bad = [f"{s.run_id} {s.setting}: ours {s.value}, authors {s.released} ({s.authors_file})" for s in unexplained(settings)]
    assert not bad, f"{path.name}: differs from the authors' released configs without a recorded reason " \
                    "(mor.recipe.RECORDED):\n" + "\n".join(bad)


def test_table3_stands_for_the_nine_released_runs_with_every_setting_sourced():
    settings = recipe(load_grid(grid_path("table3"), "cluster"))
    files = {s.authors_file for s in settings}
    assert files == {f"conf/pretrain/{r.file}" for r in load_released()[1]}
    assert all(s.source for s in settings)
    needed = {"layers", "steps", "tokens", "warmup_steps", "decay_steps", "lr", "global_batch", "seq_len", "kv",
              "initialisation"}
    for run_id in {s.run_id for s in settings}:
        assert needed <= {s.setting for s in settings if s.run_id == run_id}
    recorded = {(s.label, s.setting) for s in settings if s.status.startswith("recorded")}
    assert recorded == {(lab, k) for lab in ("MoR-3 expert", "MoR-3 token") for k in ("steps", "tokens")}
    text = format_recipe(settings)
    assert "UNEXPLAINED" not in text and "conf/pretrain/250720_pretrain_smollm-360m_vanilla_lr3e-3.yaml" in text
    assert format_recipe(settings, "csv").splitlines()[0].startswith("run_id,label,setting,value,source")


def test_a_difference_without_a_reason_is_caught():
    run = next(r.config for r in load_grid(grid_path("table3"), "cluster").runs if r.config.label == "Vanilla")
    changed = dataclasses.replace(run, train=dataclasses.replace(run.train, lr=1e-3))
    bad = unexplained(run_recipe("table3", changed))
    assert [s.setting for s in bad] == ["lr"]
