"""Where the next seeds go: the adaptive design's stopping and allocation rule, pure.

Decisions only: this module reads no file and has no command. ``mor.claims.rounds`` reads a
round's results, grids and pre-registered budget, calls ``next_round`` and writes the round's
plan.json (the Snakemake checkpoint ``seeding``: ``python -m mor.claims.rounds``).

After each round of runs the claims table says which claims are decided. This module plans
the next round. An undecided claim whose seeds have not reached the design's last look gets
seeds up to its next look, for the run blocks that decide it (``decided_by`` in
grids/claims/claims.yaml) and for those alone. Claims go cheapest expected decision first: CPU minutes
(GPU-hours) to the next look over the chance that look decides (``plan``). A claim is planned only
if its runs fit in the budget left (CPU minutes locally, GPU-hours on a cluster). Blocks that several claims share are paid once.
The design stops when no undecided claim has a next look, or when none fits the budget.

Why this keeps the error rate (``mor.stats``): the looks are pre-registered, so which claims
get seeds may depend on the data. A claim that gets no more seeds simply has fewer looks,
and its sequential p-value can only be larger than if it had run them all. Holm's family is
the mode's family pre-registered in grids/claims/claims.yaml, whether or not a member reached a
look (``mor.claims.verdict``),
so the data never choose the family either. Holm over those p-values still controls the
family-wise error (tests/unit/test_stats.py simulates exactly this).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from mor.claims.registry import Spec
from mor.stats import Design


@dataclass(frozen=True)
class Budget:
    """The adaptive design's budget for the seeds it adds (grids/claims/claims.yaml
    ``design.budget``): CPU minutes in the local mode, GPU-hours in the cluster mode."""

    total: float
    cost_per_run: dict[str, float]  # 'grid/block', 'grid' or 'default' -> cost of one run (train + its scoring)
    unit: str = "CPU min"

    def per_run(self, grid: str, block: str) -> float:
        m = self.cost_per_run
        return float(m.get(f"{grid}/{block}", m.get(grid, m["default"])))


@dataclass(frozen=True)
class Step:
    claim: str
    grid: str
    blocks: tuple[str, ...]
    seeds_from: int  # the claim's usable seeds (its predicate may have dropped some of its blocks')
    seeds_to: int    # the seeds its blocks are raised to: its next look, plus one for each seed dropped
    cost: float  # in the budget's unit: what this step adds (blocks already raised by an earlier step are free)


def next_look(n: int, design: Design) -> int | None:
    """The smallest look above n seeds (None past the last one)."""
    return next((k for k in design.looks if k > n), None)


def seed_offsets(own: int, reach: int, first_seed: int = 0) -> list[int]:
    """The seeds (offsets from the block's first) a block holds once the design has raised it
    to ``reach``: the grid's own ``0..own-1``, then the design's fresh seeds
    ``first_seed..reach-1``. The seeds between are a pilot the design was sized on
    (``Design.first_seed``): never read, so never trained (a fresh clone would otherwise
    train seeds 3-8 again for nothing). Without a pilot (first_seed <= own) it is 0..reach-1."""
    return list(range(min(own, reach))) + list(range(max(own, first_seed), reach))


def plan(table: pd.DataFrame, specs: dict[str, Spec], design: Design, budget: Budget,
         runs_per_seed: dict[tuple[str, str], int], seeds_now: dict[tuple[str, str], int],
         budget_left: float | None = None, ranking: list | None = None,
         own: dict[tuple[str, str], int] | None = None) -> tuple[list[Step], dict[tuple[str, str], int]]:
    """The next round: steps in the order taken, and the seeds each (grid, block) should
    reach. ``table``: evaluate()'s rows; ``runs_per_seed``: runs one seed of a block trains;
    ``seeds_now``: the reach each block has built (``seeds_built``); ``budget_left``: the
    budget not yet spent; ``ranking``: if a list, the undecided claims are appended to it in
    the order considered, with their cost to the next look, the chance that look decides and
    their cost per decision; ``own``: each block's own seeds, so a raise pays only for the seeds
    ``seed_offsets`` trains (None: no pilot gap, a raise from a to b trains b - a seeds).

    Claims go cheapest expected decision first: (the budget its next look adds) / (the chance
    that look decides it, ``chance next look`` of evaluate(): its current effect estimate and
    uncertainty through the test's power at the level Holm asks, ``mor.stats.chance_decides``).
    A claim without an estimate (one seed) is priced at chance 1, optimistically, so that it
    reaches the seeds an estimate needs. The smallest p first sent the whole budget to one
    expensive claim while cheap, nearly decided ones stayed at their first look."""
    left = budget.total if budget_left is None else budget_left
    target = dict(seeds_now)

    def new_seeds(grid: str, b: str, to: int) -> int:  # seeds a raise to `to` trains (a block already there: 0)
        have = target.get((grid, b), 0)
        if to <= have:
            return 0
        o = (own or {}).get((grid, b))
        if o is None:
            return to - have
        return len(set(seed_offsets(o, to, design.first_seed)) - set(seed_offsets(o, have, design.first_seed)))

    def cost(grid: str, blocks: tuple[str, ...], to: int) -> float:
        return sum(new_seeds(grid, b, to) * runs_per_seed.get((grid, b), 0) * budget.per_run(grid, b) for b in blocks)

    ranked = []  # by expected cost of a decision; a claim without an estimate (one seed) as if its look surely decides
    for _, r in table.iterrows():
        spec = specs.get(r["claim"])
        n = int(r.get("n seeds", 0) or 0)
        to = next_look(n, design)
        if r["verdict"] != "inconclusive" or spec is None or not spec.decided_by or to is None:
            continue
        grid = spec.decided_by["grid"]
        blocks = tuple(spec.decided_by["runs"])
        if not all(runs_per_seed.get((grid, b)) for b in blocks):
            continue  # a deciding block the grid (or the selected tags) lacks: no seed can build the claim
        # A block's seeds count from its own first (``first_seeds``), the look's from the design's
        # first fresh seed (the pilot's seeds below it are trained but never read), so a block
        # goes to first_seed + the look. A seed the predicate dropped (a nan, an excluded cell) is
        # replaced: the blocks go to the look plus the seeds already lost, so the claim can
        # reach that look at all.
        built = min(seeds_now.get((grid, b), 0) for b in blocks)
        to = max(design.block_seeds(to), built + (to - n))
        chance = r.get("chance next look")
        chance = float(chance) if chance is not None and math.isfinite(float(chance)) else None
        price = cost(grid, blocks, to)
        # no estimate yet (one seed has no spread): priced optimistically, at chance 1, so a claim
        # below its first look is not starved by claims whose estimates are poor
        per_decision = price / max(chance, 1e-6) if chance is not None else price
        ranked.append((per_decision, price, r["claim"], n, to, grid, blocks, chance))
    steps = []
    for per_decision, _, claim, n, to, grid, blocks, chance in sorted(ranked):
        price = cost(grid, blocks, to)
        funded = price <= left
        if ranking is not None:
            ranking.append({"claim": claim, "seeds_from": n, "seeds_to": to, "cost": round(price, 2),
                            "chance": None if chance is None else round(chance, 4),
                            "cost_per_decision": round(per_decision, 2),
                            "funded": funded})
        if not funded:
            continue
        for b in blocks:
            target[(grid, b)] = max(target.get((grid, b), 0), to)
        left -= price
        steps.append(Step(claim, grid, blocks, n, to, round(price, 2)))
    return steps, {k: v for k, v in target.items() if v > seeds_now.get(k, 0)}


def first_seeds(grid) -> dict[tuple[str, str], int]:
    """(grid, block) -> the block's first train.seed. A block's seed offsets count from it
    (``load_grid`` adds an offset to the block's own train.seed, ``seed_offsets``), never from the
    grid's first: a grid file may start its blocks at different seeds."""
    out: dict[tuple[str, str], int] = {}
    for r in grid.runs:
        k = (grid.name, r.block)
        out[k] = min(out.get(k, r.config.train.seed), r.config.train.seed)
    return out


def runs_per_seed(grid) -> dict[tuple[str, str], int]:
    """(grid, block) -> the runs one seed of that block trains (a ``mor.grids.Grid``): its runs
    at its own first seed (``first_seeds``; at the grid's first, a block starting later had none)."""
    first = first_seeds(grid)
    out: dict[tuple[str, str], int] = {}
    for r in grid.runs:
        if r.config.train.seed == first[(grid.name, r.block)]:
            out[(grid.name, r.block)] = out.get((grid.name, r.block), 0) + 1
    return out


def seeds_built(grid, frame: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(grid, block) -> the reach that block has built: one past the highest seed offset (from
    the block's own first seed, ``first_seeds``) at which every run the grid holds has its row in
    the results frame; 0 when no seed is complete. A seed with a missing run below that (a failed
    job mid-block) does not lower the reach: the seeds above it are built, so a raise pays for
    the seeds it adds past the reach alone, and the claim that lost the seed gets one seed more
    (``plan``: the look plus the seeds lost), priced as one seed. Counted up to the first gap, a
    run lost at seed 15 of 29 priced seeds 15-28 again (25.2 CPU-min for one 1.8 CPU-min seed;
    issue 61)."""
    have = set(frame["run_id"]) if frame is not None else set()
    first = first_seeds(grid)
    per: dict[tuple[str, str], dict[int, list[bool]]] = {}
    for r in grid.runs:
        k = (grid.name, r.block)
        per.setdefault(k, {}).setdefault(r.config.train.seed - first[k], []).append(r.run_id in have)
    return {k: max((offset + 1 for offset, built in seeds.items() if all(built)), default=0) for k, seeds in per.items()}


def own_seeds_held(grid) -> dict[tuple[str, str], int]:
    """(grid, block) -> the block's own seeds (the grid mode's ``seeds``) as read off a grid
    loaded at ``seed_offsets``: its seed offsets 0, 1, ... up to the first gap. Where the design
    has a pilot above the grid's own seeds (first_seed > own) a raised block skips it, so the gap
    is at the own count; where it has none (first_seed <= own) the offsets run on unbroken and
    this reads the block's reach, which prices a raise as ``own`` would (``seed_offsets`` is
    0..reach-1 for any own >= first_seed)."""
    held: dict[str, set[int]] = {}
    for r in grid.runs:
        held.setdefault(r.block, set()).add(r.config.train.seed)
    out = {}
    for b, seeds in held.items():
        base, n = min(seeds), 0
        while base + n in seeds:
            n += 1
        out[(grid.name, b)] = n
    return out


def round_grids(specs: dict[str, Spec], previous: dict | None = None) -> list[str]:
    """The grids a round reads: every claim's deciding grid, and any grid an earlier round
    raised."""
    return sorted({s.decided_by["grid"] for s in specs.values() if s.decided_by}
                  | set((previous or {}).get("seeds", {})))


def next_round(frames: dict[str, pd.DataFrame], grids: dict, design: Design, specs: dict[str, Spec],
               budget: Budget, previous: dict | None = None, family: tuple[str, ...] | None = None) -> dict:
    """One round of the adaptive design, pure: the record ``mor.claims.rounds.run_round`` writes, from the
    round's results frames (grid -> frame, as ``mor.claims.render.load_frames`` returns them)
    and the grids as this round loads them (grid -> ``mor.grids.Grid`` at the seeds
    ``previous`` asked for; a grid missing here has no runs to raise).

    Each grid's frame is read for the runs of the grid at those seeds and no others, so a
    round's verdicts rest on the seeds its plan asked for. tests/unit/test_null_adaptive.py runs
    this, round after round, on simulated results."""
    from mor.claims.registry import CLAIMS
    from mor.claims.verdict import evaluate

    so_far: dict[str, dict[str, int]] = (previous or {}).get("seeds", {})
    frames = dict(frames)
    rps, now, own, first = {}, {}, {}, {}
    for g, grid in grids.items():
        if frames.get(g) is not None:
            frames[g] = frames[g][frames[g]["run_id"].isin({r.run_id for r in grid.runs})].reset_index(drop=True)
        rps.update(runs_per_seed(grid))
        now.update(seeds_built(grid, frames.get(g)))
        own.update(own_seeds_held(grid))
        first.update(first_seeds(grid))
    spent = float((previous or {}).get("spent", 0.0))
    table = evaluate(frames, CLAIMS, design, specs, family, first)
    ranking: list[dict] = []
    steps, target = plan(table, specs, design, budget, rps, now, budget.total - spent, ranking, own)
    seeds = {g: dict(b) for g, b in so_far.items()}
    for (g, b), n in sorted(target.items()):
        seeds.setdefault(g, {})[b] = n
    undecided = table[table["verdict"] == "inconclusive"]
    waiting = [c for c, n in zip(undecided["claim"], undecided.get("n seeds", [0] * len(undecided)))
               if c in specs and specs[c].decided_by and next_look(int(n or 0), design) is not None
               and all(rps.get((specs[c].decided_by["grid"], b)) for b in specs[c].decided_by["runs"])]
    if target:  # a round goes on only if it raises some block: each raise reaches a higher look, so rounds end
        why = ""
    elif undecided.empty:
        why = "every claim is decided"
    elif not waiting:
        why = "no undecided claim can gain from seeds (past its last look, or its deciding runs are not in the grids)"
    else:
        why = f"the budget does not fit the next look of {', '.join(sorted(waiting))}"
    first_by_grid: dict[str, dict[str, int]] = {}
    for (g, b), s in sorted(first.items()):
        first_by_grid.setdefault(g, {})[b] = s
    return {
        "round": 0 if previous is None else int(previous["round"]) + 1,
        "stop": not target,
        "why": why,
        "seeds": seeds,
        "budget": budget.total,
        "spent": round(spent + sum(s.cost for s in steps), 2),
        "unit": budget.unit,
        "steps": [dataclasses.asdict(s) for s in steps],
        "ranking": ranking,
        "verdicts": {r["claim"]: {"verdict": r["verdict"], "n": int(r.get("n seeds", 0) or 0)}
                     for _, r in table.iterrows()},
        # each block's first train.seed, from which its pilot counts: the final table reads it
        # here (it reads results, not grids), so it decides as this round did
        "first_seeds": first_by_grid,
    }
