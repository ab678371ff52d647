"""Seeds: a mode-level repeat count expands every run, and tables fold the repeats."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from mor.grids import GridError, load_grid
from mor.reports.seeds import fold_seeds, mean_sd

GRID = """
name: g
runs:
  - axes: {model.scale: [135M], model.variant: [vanilla]}
modes:
  local: {scale_map: {135M: tiny}, seeds: 3}
  cluster: {scale_map: {135M: tiny}}
"""


def _grid(tmp_path, text):
    p = tmp_path / "g.yaml"
    p.write_text(text)
    return p


def test_seeds_repeat_every_run_with_its_own_id(tmp_path):
    text = GRID
    local = load_grid(_grid(tmp_path, text), "local")
    cluster = load_grid(_grid(tmp_path, text), "cluster")
    assert [r.config.train.seed for r in local.runs] == [0, 1, 2]
    assert len({r.run_id for r in local.runs}) == 3
    assert local.runs[0].run_id == cluster.runs[0].run_id  # seed 0 keeps the one-seed id
    assert local.runs[1].run_id.startswith("135M-vanilla-s1-")
    assert len({r.config.config_hash for r in local.runs}) == 3


def test_bad_seed_count_is_an_error_naming_the_key(tmp_path):
    with pytest.raises(GridError, match="seeds"):
        load_grid(_grid(tmp_path, GRID.replace("seeds: 3", "seeds: 0")), "local")


TWO_BLOCKS = """
name: g
runs:
  - name: a
    axes: {model.scale: [135M], model.variant: [vanilla]}
  - name: b
    set: {model.variant: recursive, model.num_recursions: 2}
    axes: {model.scale: [135M]}
modes:
  local: {scale_map: {135M: tiny}, seeds: 2}
"""


def test_per_block_seeds_raise_one_block_and_keep_the_ids_trained(tmp_path):
    path = _grid(tmp_path, TWO_BLOCKS)
    base = load_grid(path, "local")
    more = load_grid(path, "local", seeds={"b": 5})
    assert base.seeds() == {"a": 2, "b": 2} and more.seeds() == {"a": 2, "b": 5}
    assert sorted(r.config.train.seed for r in more.runs if r.block == "b") == [0, 1, 2, 3, 4]
    assert {r.run_id for r in base.runs} < {r.run_id for r in more.runs}  # seeds 0, 1 are the same runs
    # a seed the file does not list is still found by id (what a job of an added seed asks for)
    extra = next(r for r in more.runs if r.block == "b" and r.config.train.seed == 4)
    assert base.run(extra.run_id) == extra
    with pytest.raises(GridError, match="no run with id"):
        base.run(extra.run_id.replace("-s4-", "-s4000-"))


def test_seed_offsets_skip_a_pilot_and_keep_every_seed_its_id(tmp_path):
    """A block at offsets 0, 1, 4, 5 (the design's fresh seeds after a pilot's 2, 3) holds those
    seeds alone, and each is the run the contiguous grid would have had for it."""
    from mor.claims.seeding import seed_offsets

    path = _grid(tmp_path, TWO_BLOCKS)
    assert seed_offsets(2, 6, 4) == [0, 1, 4, 5] and seed_offsets(2, 6, 0) == list(range(6))
    assert seed_offsets(2, 2, 4) == [0, 1]
    gapped = load_grid(path, "local", seeds={"b": seed_offsets(2, 6, 4)})
    full = load_grid(path, "local", seeds={"b": 6})
    assert sorted(r.config.train.seed for r in gapped.runs if r.block == "b") == [0, 1, 4, 5]
    assert {r.run_id for r in gapped.runs} < {r.run_id for r in full.runs}
    assert gapped.seeds() == {"a": 2, "b": 4}


@pytest.mark.parametrize("seeds, message", [({"c": 3}, "block 'c', which the grid does not have"),
                                            ({"a": 0}, "expected an integer in 1..1000"),
                                            ({"a": True}, "expected an integer"),
                                            ({"a": [0, 0, 1]}, "distinct integer offsets"),
                                            ({"a": []}, "distinct integer offsets"),
                                            ({"a": [0, -1]}, "distinct integer offsets"),
                                            ({"a": [0, True]}, "distinct integer offsets")])
def test_bad_per_block_seeds_name_the_block(tmp_path, seeds, message):
    with pytest.raises(GridError, match=message):
        load_grid(_grid(tmp_path, TWO_BLOCKS), "local", seeds=seeds)


def test_mean_sd_by_hand():
    m, sd, n = mean_sd([5.0, 5.2, 5.6])
    assert (m, n) == (pytest.approx(5.2666666667), 3)
    assert sd == pytest.approx(statistics.stdev([5.0, 5.2, 5.6]))
    assert mean_sd([4.0]) == (4.0, None, 1)
    assert mean_sd([4.0, float("nan")]) == (4.0, None, 1)


def test_fold_groups_by_config_without_seed():
    def row(variant, seed, nll):
        cfg = {"model": {"variant": variant}, "train": {"seed": seed, "tokens": 10}}
        return {"run_id": f"{variant}-{seed}", "seed": seed, "val_nll": nll, "variant": variant,
                "config_json": json.dumps(cfg)}
    df = pd.DataFrame([row("vanilla", 0, 5.0), row("vanilla", 1, 5.2), row("mor", 0, 4.9), row("vanilla", 2, 5.6)])
    out = fold_seeds(df, ("val_nll",)).set_index("variant")
    assert out.loc["vanilla", "n_seeds"] == 3 and out.loc["mor", "n_seeds"] == 1
    assert out.loc["vanilla", "val_nll"] == pytest.approx((5.0 + 5.2 + 5.6) / 3)
    assert out.loc["vanilla", "val_nll sd"] == pytest.approx(statistics.stdev([5.0, 5.2, 5.6]))
    assert pd.isna(out.loc["mor", "val_nll sd"])
    assert out.loc["vanilla", "run_id"] == "vanilla-0, vanilla-1, vanilla-2"


def test_evidence_is_stated_per_mode_and_checked(tmp_path):
    """`modes.<mode>.evidence` says what the mode's numbers are good for; the table note
    carries the mode's seed count; an unknown kind fails at load time naming the key; a run's
    identity does not depend on it."""
    from mor.reports.common import evidence_note

    text = GRID.replace("seeds: 3}", "seeds: 3, evidence: deciding}")
    p = _grid(tmp_path, text)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert [r.run_id for r in load_grid(p, "local").runs] == [r.run_id for r in load_grid(_grid(plain, GRID), "local").runs]
    note = evidence_note(p, "local")
    assert note.startswith("Evidence: deciding.") and "(3)" in note and "grids/g.yaml" in note
    assert evidence_note(p, "cluster") == ""  # the mode says nothing: no note
    with pytest.raises(GridError, match="evidence"):
        load_grid(_grid(tmp_path, GRID.replace("seeds: 3}", "seeds: 3, evidence: decisive}")), "local")


def test_fold_gives_the_benchmark_stderr_over_seeds():
    """Three seeds with benchmark stderrs 0.03, 0.04, 0.12 on the same documents: the sampling
    stderr is their root mean square, sqrt((0.03^2 + 0.04^2 + 0.12^2) / 3) = 0.13 / sqrt(3),
    per task and for the average alike (not / 3: the draw of documents is shared)."""
    def row(seed, se):
        cfg = {"model": {"variant": "mor"}, "train": {"seed": seed}}
        return {"run_id": f"r{seed}", "seed": seed, "avg_accuracy": 0.3, "avg_accuracy_stderr": se,
                "accuracy": {"piqa": 0.5}, "accuracy_stderr": {"piqa": se}, "config_json": json.dumps(cfg)}
    out = fold_seeds(pd.DataFrame([row(0, 0.03), row(1, 0.04), row(2, 0.12)]), ("avg_accuracy",)).iloc[0]
    assert out["avg_accuracy_stderr"] == pytest.approx(0.13 / 3 ** 0.5)
    assert out["accuracy_stderr"]["piqa"] == pytest.approx(0.13 / 3 ** 0.5)
    assert out["accuracy"]["piqa"] == pytest.approx(0.5)


def test_a_seed_the_design_adds_is_scored_without_lm_eval_and_keeps_its_id():
    """fig5c's own 3 seeds run the six benchmarks; a seed past them (the claims' design's) is
    scored for NLL and router statistics alone, under the same run id: no table draws it and
    no claim reads an accuracy, so lm-eval there would be CPU spent for nothing."""
    from mor.grids import mode_settings

    path = Path(__file__).resolve().parents[2] / "grids" / "fig5c.yaml"
    own = mode_settings(path, "local")["seeds"]
    gapped = load_grid(path, "local", seeds={"mor": [*range(own), own + 6]})
    contiguous = load_grid(path, "local", seeds={"mor": own + 7})
    assert {r.run_id for r in gapped.runs} < {r.run_id for r in contiguous.runs}
    for r in gapped.runs:
        added = r.config.train.seed - min(x.config.train.seed for x in gapped.runs) >= own
        assert bool(r.config.eval.lm_eval_tasks) is not added, (r.run_id, r.config.eval.lm_eval_tasks)
        assert r.config.eval.nll_tokens == contiguous.run(r.run_id).config.eval.nll_tokens
        assert r.config.eval == contiguous.run(r.run_id).config.eval  # the same whichever way it is asked for
