"""The adaptive design's allocation rule (mor.claims.seeding): seeds go to undecided claims
only, up to their next pre-registered look, for the blocks that decide them, within the
CPU budget; blocks shared by claims are paid once. The round's files and command
(mor.claims.rounds) plan from results on disk."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers.paths import REPO
from mor.claims import load_specs
from mor.claims.rounds import load_budget, own_seeds, round_grid
from mor.claims.seeding import Budget, next_look, own_seeds_held, plan, runs_per_seed, seed_offsets
from mor.grids import load_grid
from mor.stats import Design

DESIGN, SPECS = load_specs()
D3 = Design(looks=(3, 6, 9))  # the allocation rule's tests read looks at 3, 6, 9 (the shipped design's are 6, 9)


def test_every_claim_names_blocks_its_grid_has():
    for cid, spec in SPECS.items():
        d = spec.decided_by
        grid = load_grid(REPO / "grids" / f"{d['grid']}.yaml", "local")
        blocks = {r.block for r in grid.runs}
        assert set(d["runs"]) <= blocks, (cid, set(d["runs"]) - blocks)


def test_next_look():
    d = Design(looks=(3, 6, 9))
    assert [next_look(n, d) for n in (0, 1, 3, 5, 6, 9, 12)] == [3, 3, 6, 6, 9, None, None]


def _table(rows):
    return pd.DataFrame([{"claim": c, "verdict": v, "n seeds": n, "p": p, "chance next look": ch}
                         for c, v, n, p, ch in ((*r, None) if len(r) == 4 else r for r in rows)])


def test_seeds_go_to_the_cheapest_expected_decision_first_within_budget():
    """Cost per decision = CPU-min to the next look / the chance that look decides. sharing-costs
    has the smallest p (the old rule's first pick, which spent 45 of the 60 minutes on it) but a
    chance of 0.5 for 45 minutes: 90 a decision. aux-separates (9 min, 0.9: 10), mor-beats-
    recursive-tokens (45, 0.9: 50) and balancing-entropy (6, 0.1: 60) go first; sharing-costs
    then costs only its vanilla block (recursive is raised), 15 min, which no longer fits."""
    budget = Budget(60.0, {"default": 1.0, "deciding": 5.0, "deciding/balancing": 1.0})
    rps = {("deciding", "vanilla"): 1, ("deciding", "recursive"): 2, ("deciding", "mor"): 1, ("deciding", "balancing"): 2,
           ("fig5c", "mor"): 3}
    now = {k: 3 for k in rps}
    table = _table([("sharing-costs", "inconclusive", 3, 0.04, 0.5),
                    ("mor-beats-recursive-tokens", "inconclusive", 3, 0.3, 0.9),
                    ("balancing-maxvio", "holds", 3, 0.001, None),        # decided: nothing
                    ("balancing-entropy", "inconclusive", 3, 0.2, 0.1),
                    ("aux-separates", "inconclusive", 3, 0.5, 0.9),
                    ("deeper-recursion", "inconclusive", 9, 0.3, None)])  # past the last look
    ranking = []
    steps, target = plan(table, SPECS, D3, budget, rps, now, ranking=ranking)
    assert [s.claim for s in steps] == ["aux-separates", "mor-beats-recursive-tokens", "balancing-entropy"]
    assert [s.cost for s in steps] == [9.0, 45.0, 6.0]
    assert [(r["claim"], r["cost_per_decision"], r["funded"]) for r in ranking] == [
        ("aux-separates", 10.0, True), ("mor-beats-recursive-tokens", 50.0, True), ("balancing-entropy", 60.0, True),
        ("sharing-costs", 90.0, False)]
    assert target == {("fig5c", "mor"): 6, ("deciding", "recursive"): 6, ("deciding", "mor"): 6, ("deciding", "balancing"): 6}
    # with the budget spent, nothing more
    assert plan(table, SPECS, D3, budget, rps, now, budget_left=1.0)[0] == []
    # a claim with no estimate yet (one seed: no spread) is priced at chance 1: its cost alone
    table.loc[table["claim"] == "balancing-entropy", "chance next look"] = None
    ranking = []
    plan(table, SPECS, D3, budget, rps, now, ranking=ranking)
    assert [(r["claim"], r["chance"], r["cost_per_decision"]) for r in ranking[:2]] == [
        ("balancing-entropy", None, 6.0), ("aux-separates", 0.9, 10.0)]


def test_a_design_with_a_pilot_raises_blocks_to_first_seed_plus_the_look():
    """first_seed 9, one look at 20: the table's n counts fresh seeds, a block's seeds count
    from its first. From the grid's own 3 seeds the pair goes to 9 + 20 = 29 (26 seeds x 2 runs
    x 0.9 CPU-min, the pilot's seeds 3-8 included); where the pilot's 9 are built, 20 seeds
    cost 36; a fresh seed the predicate dropped (19 fresh of 20 built) is replaced: 30."""
    d = Design(looks=(20,), first_seed=9)
    budget = Budget(200.0, {"default": 1.0, "deciding/balancing": 0.9})
    rps = {("deciding", "balancing"): 2}
    table = _table([("balancing-maxvio", "inconclusive", 0, None)])
    steps, target = plan(table, SPECS, d, budget, rps, {("deciding", "balancing"): 3})
    assert target == {("deciding", "balancing"): 29} and steps[0].cost == pytest.approx(26 * 2 * 0.9)
    steps, target = plan(table, SPECS, d, budget, rps, {("deciding", "balancing"): 9})
    assert target == {("deciding", "balancing"): 29} and steps[0].cost == pytest.approx(20 * 2 * 0.9)
    table = _table([("balancing-maxvio", "inconclusive", 19, None)])
    assert next_look(19, d) == 20
    _, target = plan(table, SPECS, d, budget, rps, {("deciding", "balancing"): 29})
    assert target == {("deciding", "balancing"): 30}
    # Design refuses a first seed that is not a count
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="first_seed must be an integer >= 0"):
            Design(looks=(20,), first_seed=bad)


def test_claims_below_the_first_look_are_raised_to_it():
    budget = Budget(100.0, {"default": 1.0})
    table = _table([("middle-cycle-equal-unique", "inconclusive", 1, None)])
    steps, target = plan(table, SPECS, D3, budget, {("table11", "middle-cycle"): 1, ("table11", "cycle"): 1},
                         {("table11", "middle-cycle"): 1, ("table11", "cycle"): 1})
    assert steps[0].seeds_to == 3 and target == {("table11", "middle-cycle"): 3, ("table11", "cycle"): 3}


def test_a_claim_that_lost_a_seed_gets_it_replaced_instead_of_stalling():
    """flatter-path drops a seed whose optima sit at one size; with 2 usable seeds of its
    blocks' 3, raising the blocks to the claim's next look (3) would train nothing and the
    design would stall below the look, reporting a budget it never spent. The blocks go to
    3 + 1 = 4, so the claim reaches n = 3 if the new seed is usable."""
    budget = Budget(1000.0, {"default": 1.0})
    rps = {("table9", "vanilla"): 12, ("table9", "mor"): 12}
    now = {k: 3 for k in rps}
    table = _table([("flatter-path", "inconclusive", 2, None)])
    steps, target = plan(table, SPECS, D3, budget, rps, now)
    assert [(s.seeds_from, s.seeds_to, s.cost) for s in steps] == [(2, 4, 24.0)]  # 1 seed x 24 runs x 1 min
    assert target == {("table9", "vanilla"): 4, ("table9", "mor"): 4}
    # at a look with its seeds all usable, the usual step: 3 -> 6
    table = _table([("flatter-path", "inconclusive", 3, 0.5)])
    assert [(s.seeds_from, s.seeds_to) for s in plan(table, SPECS, D3, budget, rps, now)[0]] == [(3, 6)]


def test_a_claim_whose_deciding_blocks_are_missing_gets_no_seeds():
    """mor-beats-recursive-tokens needs the deciding grid's mor block; without it no seed can
    build the claim, so the plan neither pays for it nor lets it keep the rounds going."""
    budget = Budget(1000.0, {"default": 1.0})
    rps = {("deciding", "vanilla"): 1, ("deciding", "recursive"): 2}  # no mor block
    now = {k: 3 for k in rps}
    table = _table([("mor-beats-recursive-tokens", "not built", 0, None),
                    ("sequence-worst", "inconclusive", 9, 0.4)])  # past the last look
    table.loc[0, "verdict"] = "inconclusive"
    assert plan(table, SPECS, DESIGN, budget, rps, now) == ([], {})


def test_budget_and_run_counts_from_the_shipped_files():
    b = load_budget()
    assert b.total == 120 and b.unit == "CPU min" and b.per_run("deciding", "vanilla") == pytest.approx(0.9)
    assert b.per_run("deciding", "balancing") == pytest.approx(0.9) and b.per_run("table13", "x") == pytest.approx(0.9)
    rps = runs_per_seed(load_grid(REPO / "grids" / "deciding.yaml", "local"))
    assert rps == {("deciding", "vanilla"): 1, ("deciding", "recursive"): 2, ("deciding", "mor"): 1,
                   ("deciding", "balancing"): 2}


def _null_rows(runs, rng) -> list[dict]:
    """Result rows of the deciding grid's runs with no effects (NLL, MaxVio and entropy noise)."""
    import json

    return [{"run_id": r.run_id, "grid": "deciding", "config_hash": r.config.config_hash, "git_commit": "abc",
             "mode": "local", "scale": r.config.model.scale, "paper_scale": r.config.paper_scale,
             "seed": r.config.train.seed, "variant": r.config.model.variant,
             "tying": None if r.config.model.variant == "vanilla" else r.config.model.tying,
             "num_recursions": r.config.model.num_recursions, "reduced": r.config.model.reduced, "n_params": 1,
             "unique_layers": 1, "effective_layers": 1, "val_nll": 3.7 + rng.normal(0, 0.02),
             "router_type": r.config.model.router.type if r.config.model.variant == "mor" else None,
             "max_vio": rng.normal(1, 0.3), "entropy": rng.normal(1, 0.3), "config_json": json.dumps(r.config.to_dict())}
            for r in runs]


def test_the_command_plans_from_results_on_disk(tmp_path, capsys):
    """Results of the deciding grid's 3 seeds with no effects. The command plans the local
    mode's design: of the deciding grid's claims only the balancing pair is in the local
    family, so only its block is raised, to the look counted from the first fresh seed
    (first_seed + look: the 3 seeds here are all pilot seeds, below it)."""
    import json

    import numpy as np

    from mor.claims.rounds import main
    from mor.claims.seeding import seeds_built
    from mor.results import write_rows

    grid = load_grid(REPO / "grids" / "deciding.yaml", "local")
    rows = _null_rows(grid.runs, np.random.default_rng(0))
    (tmp_path / "results").mkdir()
    write_rows(tmp_path / "results" / "deciding.parquet", rows)
    import pandas as pd
    assert seeds_built(grid, pd.DataFrame(rows)) == {("deciding", b): 3 for b in ("vanilla", "recursive", "mor", "balancing")}
    main(["--results", str(tmp_path / "results"), "--out", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "plan.json").read_text())
    raised = {s["blocks"][0] for s in record["steps"]}
    local, _ = load_specs(mode="local")
    n = local.first_seed + local.looks[0]
    assert local.first_seed > 3 and raised == {"balancing"}
    assert record["verdicts"]["balancing-maxvio"]["n"] == 0  # every seed is the pilot's
    assert record["verdicts"]["sharing-costs"]["verdict"] == "not tested in this mode"
    fresh = f"{local.first_seed}-{n - 1}"
    assert f"-> {n} seeds" in out
    assert all(f"deciding block {b}: {3 + local.looks[0]} seeds (offsets 0-2, {fresh})" in out for b in raised)
    assert record["round"] == 0 and not record["stop"]
    assert all(record["seeds"]["deciding"][b] == n for b in raised)
    # the grid as the next round loads it keeps the ids of the 3 seeds trained and holds the
    # look's fresh seeds, but none of the pilot's between them (never read, so never trained)
    again = round_grid(REPO / "grids" / "deciding.yaml", "local", record["seeds"]["deciding"], local.first_seed)
    assert {r.run_id for r in grid.runs} < {r.run_id for r in again.runs}
    held = {r.config.train.seed for r in again.runs if r.block == "balancing"}
    assert held == set(range(3)) | set(range(local.first_seed, n))
    assert {r.config.train.seed for r in again.runs if r.block == "vanilla"} == set(range(3))
    # so the step pays for the look's seeds alone: 2 runs a seed of the balancing pair
    budget = load_budget(mode="local")
    assert record["spent"] == pytest.approx(local.looks[0] * 2 * budget.per_run("deciding", "balancing"))
    assert sum(s["cost"] for s in record["steps"]) == pytest.approx(record["spent"])
    assert record["spent"] <= record["budget"]
    # and seeds_built reads the grown grid's reach through the gap once every held seed is built
    rows_again = [{"run_id": r.run_id} for r in again.runs]
    assert seeds_built(again, pd.DataFrame(rows_again))[("deciding", "balancing")] == n
    own_only = [{"run_id": r.run_id} for r in again.runs if r.config.train.seed < 3]
    assert seeds_built(again, pd.DataFrame(own_only))[("deciding", "balancing")] == 3



@pytest.mark.parametrize("mode", ["local", "cluster"])
def test_the_rule_reads_a_grids_own_seeds_off_the_grid_as_its_file_gives_them(mode):
    """next_round reads no file: each block's own seeds come off the grid as loaded
    (own_seeds_held) and must price a raise as the grid file's count (rounds.own_seeds) does,
    for every claim grid: unraised; raised past a pilot (first_seed above the own seeds: the
    offsets break at the own count); raised without one (first_seed 0: unbroken offsets)."""
    _, specs = load_specs(mode=mode)
    for name in sorted({s.decided_by["grid"] for s in specs.values() if s.decided_by}):
        path = REPO / "grids" / f"{name}.yaml"
        own = own_seeds(str(path), mode)
        grid = load_grid(path, mode)
        assert own_seeds_held(grid) == {(name, b): own for b in grid.blocks}, name
        first, rest = grid.blocks[0], grid.blocks[1:]
        for first_seed in (own + 3, 0):
            reach = first_seed + own + 2
            held = own_seeds_held(round_grid(path, mode, {first: reach}, first_seed))
            assert all(held[(name, b)] == own for b in rest), name
            assert held[(name, first)] == (own if first_seed > own else reach), (name, first_seed)
            raise_cost = {len(set(seed_offsets(o, reach + 4, first_seed)) - set(seed_offsets(o, reach, first_seed)))
                          for o in (own, held[(name, first)])}
            assert raise_cost == {4}, (name, first_seed, raise_cost)


LATE_BLOCK = """
name: g
runs:
  - name: a
    axes: {model.scale: [135M], model.variant: [vanilla]}
  - name: b
    set: {model.variant: recursive, model.num_recursions: 2, train.seed: 100}
    axes: {model.scale: [135M], model.tying: [cycle, sequence]}
modes:
  local: {scale_map: {135M: tiny}, seeds: 2}
"""


def test_a_block_starting_at_a_later_seed_counts_its_seeds_from_its_own_first(tmp_path):
    """Block b starts at train.seed 100, a at 0. load_grid raises b from 100 (``seed_offsets``
    are offsets from the block's own first seed), so its run count per seed and its reach count
    from 100 too; counted from the grid's first (0), b trained no run a seed (so no claim of it
    got seeds) and had built a reach of 106."""
    from mor.claims.seeding import first_seeds, seeds_built

    path = tmp_path / "g.yaml"
    path.write_text(LATE_BLOCK)
    grid = load_grid(path, "local", seeds={"b": seed_offsets(2, 6, 4)})
    assert sorted({r.config.train.seed for r in grid.runs if r.block == "b"}) == [100, 101, 104, 105]
    assert first_seeds(grid) == {("g", "a"): 0, ("g", "b"): 100}
    assert runs_per_seed(grid) == {("g", "a"): 1, ("g", "b"): 2}
    every = pd.DataFrame({"run_id": [r.run_id for r in grid.runs]})
    assert seeds_built(grid, every) == {("g", "a"): 2, ("g", "b"): 6}
    own_only = pd.DataFrame({"run_id": [r.run_id for r in grid.runs if r.config.train.seed in (0, 1, 100, 101)]})
    assert seeds_built(grid, own_only) == {("g", "a"): 2, ("g", "b"): 2}
    first_missing = pd.DataFrame({"run_id": [r.run_id for r in grid.runs if r.config.train.seed != 100]})
    assert seeds_built(grid, first_missing) == {("g", "a"): 2, ("g", "b"): 6}  # seeds 101-105 built: a failed first seed is one seed lost, not the block
    # a run lost mid-block (b's seed 104, one of its 2 runs) leaves the reach where the built seeds put it
    lost = next(r.run_id for r in grid.runs if r.config.train.seed == 104)
    assert seeds_built(grid, every[every["run_id"] != lost]) == {("g", "a"): 2, ("g", "b"): 6}
    last = next(r.run_id for r in grid.runs if r.config.train.seed == 105)  # the last seed's: its reach is the one below
    assert seeds_built(grid, every[every["run_id"] != last]) == {("g", "a"): 2, ("g", "b"): 5}
    assert own_seeds_held(grid) == {("g", "a"): 2, ("g", "b"): 2}


def test_a_round_counts_the_pilot_from_the_blocks_first_seed_when_its_first_runs_failed():
    """The local design raises the balancing block past its pilot (offsets 0-2, then the 20 fresh
    seeds 9-28). Its seed-0 runs failed (no rows): the round still counts the pilot from the
    block's first seed as the grid gives it (``first_seeds``), so all 20 fresh seeds are read;
    counted from the first seed with a comparison (1), the pilot would swallow fresh seed 9."""
    import numpy as np

    from mor.claims.registry import load_family
    from mor.claims.seeding import next_round

    local, specs = load_specs(mode="local")
    reach = local.block_seeds(local.looks[0])
    grid = round_grid(REPO / "grids" / "deciding.yaml", "local", {"balancing": reach}, local.first_seed)
    runs = [r for r in grid.runs if not (r.block == "balancing" and r.config.train.seed == 0)]
    frame = pd.DataFrame(_null_rows(runs, np.random.default_rng(1)))
    record = next_round({"deciding": frame}, {"deciding": grid}, local, specs, load_budget(mode="local"),
                        family=load_family("local"))
    assert record["verdicts"]["balancing-maxvio"]["n"] == local.looks[0]
    # the final table reads results, not grids: it takes the blocks' first seeds from the
    # round's record (JSON, as plan.json holds it) and decides as the round did
    from mor.claims.render import first_seeds_of
    from mor.claims.verdict import evaluate

    record = json.loads(json.dumps(record))
    assert record["first_seeds"]["deciding"]["balancing"] == 0
    first = first_seeds_of([record])
    table = evaluate({"deciding": frame}, design=local, specs=specs, family=load_family("local"), first_seeds=first)
    got = {r["claim"]: (r["verdict"], int(r.get("n seeds", 0) or 0)) for _, r in table.iterrows()}
    assert got == {c: (v["verdict"], v["n"]) for c, v in record["verdicts"].items()}
    assert first_seeds_of([{"round": 0}]) is None and first_seeds_of(None) is None  # an older plan.json: read off the data
