"""The adaptive design in one Snakemake command (workflows/claims.smk): `tables/claims`
runs round 0 on the grids' own seeds, and each checkpoint `seeding` round raises the seeds
of the blocks that decide the still-undecided claims, until a round's plan stops. Real
Snakemake, real (tiny) training; the expected rounds are derived from the shipped design
(grids/claims/claims.yaml) and mor.claims.seeding.plan, not copied from a run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from test_workflow import TINY_LOCAL_MODE, snakemake

from mor.claims import load_specs
from mor.claims.seeding import load_budget, next_look
from mor.grids import load_grid

# The deciding grid's two NLL blocks, one seed each: sharing-costs and sequence-worst read
# them (mor-beats-recursive-tokens and the balancing claims find no runs and stay unbuilt).
GRID = """
name: deciding
artifacts: []
defaults:
  data: {source: django-docs, tokenizer: bpe-4096}
runs:
  - name: vanilla
    set: {model.variant: vanilla}
    axes: {model.scale: [135M]}
  - name: recursive
    set: {model.variant: recursive, model.num_recursions: 2}
    axes: {model.scale: [135M], model.tying: [sequence, middle_cycle]}
""" + TINY_LOCAL_MODE + "reference: []\n"


@pytest.mark.slow
def test_claims_add_seeds_to_the_deciding_blocks_round_by_round(tmp_path, data_root):
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "deciding.yaml").write_text(GRID)
    cfg = ["--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}"]
    snakemake("tables/claims", *cfg)

    design, specs = load_specs()
    budget = load_budget()
    rounds = []
    while (tmp_path / "results" / "claims" / f"round{len(rounds)}" / "plan.json").exists():
        rounds.append(json.loads((tmp_path / "results" / "claims" / f"round{len(rounds)}" / "plan.json").read_text()))
    assert rounds and rounds[-1]["stop"] and not any(r["stop"] for r in rounds[:-1])

    # round 0: one seed is below the first look, so both claims get seeds up to it, for the
    # two blocks that decide them, paid once: 3 runs a seed x 2 more seeds x the block's cost
    first = design.looks[0]
    r0 = rounds[0]
    assert r0["verdicts"]["sharing-costs"] == {"verdict": "inconclusive", "n": 1}
    assert r0["seeds"] == {"deciding": {"vanilla": first, "recursive": first}}
    cost = 3 * (first - 1) * budget.per_run("deciding", "vanilla")
    assert sum(s["cost"] for s in r0["steps"]) == pytest.approx(cost)
    assert {s["claim"] for s in r0["steps"]} == {"sharing-costs", "sequence-worst"}

    # round 1 trained exactly the seeds round 0 asked for: the runs of the grid loaded with
    # those seeds, whose first seed keeps its id
    want = {r.run_id for r in load_grid(grids / "deciding.yaml", "local", seeds=r0["seeds"]["deciding"]).runs}
    got = pd.read_parquet(tmp_path / "results" / "claims" / "round1" / "deciding.parquet")
    assert set(got["run_id"]) == want and len(want) == 3 * first
    assert {r.run_id for r in load_grid(grids / "deciding.yaml", "local").runs} < want
    assert sorted(got.groupby("variant")["seed"].nunique()) == [first, first]

    # the last round stops for a stated reason that its numbers bear out
    last = rounds[-1]
    if "budget does not fit" in last["why"]:
        n = last["verdicts"]["sharing-costs"]["n"]
        more = 3 * (next_look(n, design) - n) * budget.per_run("deciding", "vanilla")
        assert last["spent"] + more > budget.total
    else:
        assert last["why"].startswith(("every claim is decided", "no undecided claim can gain"))

    # the table is drawn from the last round, says so, and counts its seeds
    table = pd.read_csv(tmp_path / "tables" / "claims" / "claims.csv").set_index("claim")
    assert table.loc["sharing-costs", "n seeds"] == last["verdicts"]["sharing-costs"]["n"] >= first
    md = (tmp_path / "tables" / "claims" / "claims.md").read_text()
    assert f"{len(rounds)} round(s)" in md and last["why"] in md

    # nothing is redone when nothing changed
    again = snakemake("tables/claims", *cfg)
    assert "Nothing to be done" in again.stdout + again.stderr
