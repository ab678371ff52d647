"""The adaptive design in one Snakemake command (workflows/rules/claims.smk): `tables/claims`
runs round 0 on the grids' own seeds, and each checkpoint `seeding` round raises the seeds
of the blocks that decide the still-undecided claims, until a round's plan stops. Real
Snakemake, real (tiny) training; the expected rounds are derived from the shipped design
(grids/claims/claims.yaml) and mor.claims.seeding.plan, not copied from a run."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from helpers.workflow import TINY_LOCAL_MODE, snakemake

from mor.claims import SPEC_FILE, load_specs
from mor.claims.rounds import load_budget, round_grid
from mor.claims.seeding import next_look
from mor.grids import load_grid
from mor.layout import run_dir

# The deciding grid's balancing pair, one seed: balancing-maxvio, balancing-entropy and balancing-nll read it
# (the other deciding claims find no runs and stay unbuilt). The cheapest block of the design
# (0.9 CPU-min a run). The grids folder carries its own claims/claims.yaml (the workflow reads
# it in place of the shipped one): the shipped design with the local look at 2 fresh seeds from
# seed 2, so the grid's one seed and seed 1 are a pilot's: the pair goes to first_seed + 2 = 4,
# training seeds 2 and 3 and never the pilot's seed 1 (6 tiny runs, where the shipped 9 + 20
# would train 46).
GRID = """
name: deciding
artifacts: []
defaults:
  data: {source: django-docs, tokenizer: bpe-4096}
runs:
  - name: balancing
    set: {model.variant: mor, model.num_recursions: 3,
          model.router: {type: token_choice, func: softmax, alpha: 1.0, arch: linear, balance_coeff: 0.1}}
    axes: {model.scale: [135M], model.router.balancing: [loss, loss_free]}
""" + TINY_LOCAL_MODE + "reference: []\n"


@pytest.mark.slow
def test_claims_add_seeds_to_the_deciding_blocks_round_by_round(tmp_path, data_root):
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "deciding.yaml").write_text(GRID)
    spec = yaml.safe_load(SPEC_FILE.read_text())
    spec["design"]["by_mode"]["local"].update(looks=[2], first_seed=2)
    (grids / "claims").mkdir()
    (grids / "claims" / "claims.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    cfg = ["--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}"]
    snakemake("tables/claims", *cfg)

    design, specs = load_specs(grids / "claims" / "claims.yaml", mode="local")
    assert design.looks == (2,) and design.first_seed == 2  # the folder's design, not the shipped one
    budget = load_budget(grids / "claims" / "claims.yaml")
    rounds = []
    while (tmp_path / "results" / "claims" / f"round{len(rounds)}" / "plan.json").exists():
        rounds.append(json.loads((tmp_path / "results" / "claims" / f"round{len(rounds)}" / "plan.json").read_text()))
    assert rounds and rounds[-1]["stop"] and not any(r["stop"] for r in rounds[:-1])

    # round 0: the one seed is below first_seed, so both claims have no fresh seed and no
    # estimate and are priced at chance 1; the pair is raised once, for both, to first_seed +
    # the look: 2 runs a seed x the look's fresh seeds x 0.9 CPU-min (the pilot's seed 1 is
    # not trained, so not paid for), and the ranking says so
    first, raised = design.looks[0], design.first_seed + design.looks[0]
    r0 = rounds[0]
    assert design.first_seed >= 1 and r0["verdicts"]["balancing-maxvio"] == {"verdict": "inconclusive", "n": 0}
    assert r0["seeds"] == {"deciding": {"balancing": raised}}
    cost = 2 * first * budget.per_run("deciding", "balancing")
    assert sum(s["cost"] for s in r0["steps"]) == pytest.approx(cost) and cost <= budget.total
    pair = {"balancing-maxvio", "balancing-entropy", "balancing-nll"}  # the NLL part is its own claim (issue 48)
    assert {s["claim"] for s in r0["steps"]} == pair
    assert {r["claim"] for r in r0["ranking"]} == pair
    assert all(r["chance"] is None and r["funded"] for r in r0["ranking"])

    # round 1 trained exactly the seeds round 0 asked for: the grid's own seed 0 (its id kept)
    # and the look's fresh seeds 2, 3, and not the pilot's seed 1 (no run folder either)
    want = {r.run_id for r in round_grid(grids / "deciding.yaml", "local", r0["seeds"]["deciding"], design.first_seed).runs}
    got = pd.read_parquet(tmp_path / "results" / "claims" / "round1" / "deciding.parquet")
    assert set(got["run_id"]) == want and len(want) == 2 * (1 + first)
    base = min(got["seed"])
    assert sorted(set(got["seed"] - base)) == [0, *range(design.first_seed, raised)]
    assert {r.run_id for r in load_grid(grids / "deciding.yaml", "local").runs} < want
    pilot = {r.run_id for r in load_grid(grids / "deciding.yaml", "local", seeds={"balancing": raised}).runs} - want
    assert len(pilot) == 2 and not any(run_dir(tmp_path / "runs", rid).exists() for rid in pilot)

    # the last round stops for a stated reason that its numbers bear out: the pair is at its
    # last look, so nothing can gain from seeds (or both are decided)
    last = rounds[-1]
    assert last["verdicts"]["balancing-maxvio"]["n"] == first
    assert last["why"].startswith(("every claim is decided", "no undecided claim can gain"))
    assert next_look(first, design) is None

    # the table is drawn from the last round, says so, counts its seeds and shows the ranking
    table = pd.read_csv(tmp_path / "tables" / "claims" / "claims.csv").set_index("claim")
    assert table.loc["balancing-maxvio", "n seeds"] == first  # the fresh seeds alone: the pilot's is not read
    md = (tmp_path / "tables" / "claims" / "claims.md").read_text()
    assert f"Seeds at offsets below {design.first_seed}" in md and "are not read" in md
    assert f"{len(rounds)} round(s)" in md and last["why"] in md and "Ranking (CPU-min to the next look" in md

    # nothing is redone when nothing changed
    again = snakemake("tables/claims", *cfg)
    assert "Nothing to be done" in again.stdout + again.stderr
