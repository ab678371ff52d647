"""Where the next seeds go: the adaptive design's stopping and allocation rule, pure.

After each round of runs the claims table says which claims are decided. This module plans
the next round. An undecided claim whose seeds have not reached the design's last look gets
seeds up to its next look, for the run blocks that decide it (``decided_by`` in
grids/claims/claims.yaml) and for those alone. Claims go most promising first: the smallest
sequential p; claims below the first look come next, cheapest first. A claim is planned only
if its runs fit in the CPU minutes left. Blocks that several claims share are paid once.
The design stops when no undecided claim has a next look, or when none fits the budget.

Why this keeps the error rate (``mor.stats``): the looks are pre-registered, so which claims
get seeds may depend on the data. A claim that gets no more seeds simply has fewer looks,
and its sequential p-value can only be larger than if it had run them all. Holm's family is
every claim whose grids are built, whether or not it reached a look (``mor.claims.verdict``),
so the data never choose the family either. Holm over those p-values still controls the
family-wise error (tests/test_stats.py simulates exactly this).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from mor.claims.registry import SPEC_FILE, Spec
from mor.stats import Design


@dataclass(frozen=True)
class Budget:
    """The CPU budget of the adaptive design (grids/claims/claims.yaml ``design.budget``)."""

    cpu_minutes: float
    minutes_per_run: dict[str, float]  # 'grid/block', 'grid' or 'default' -> minutes per run

    def per_run(self, grid: str, block: str) -> float:
        m = self.minutes_per_run
        return float(m.get(f"{grid}/{block}", m.get(grid, m["default"])))


def load_budget(path: Path = SPEC_FILE) -> Budget:
    b = yaml.safe_load(Path(path).read_text())["design"]["budget"]
    if "default" not in b["minutes_per_run"]:
        raise ValueError(f"{path}: design.budget.minutes_per_run needs a 'default'")
    return Budget(float(b["local_cpu_minutes"]), {k: float(v) for k, v in b["minutes_per_run"].items()})


@dataclass(frozen=True)
class Step:
    claim: str
    grid: str
    blocks: tuple[str, ...]
    seeds_from: int
    seeds_to: int
    minutes: float  # what this step adds (blocks already raised by an earlier step are free)


def next_look(n: int, design: Design) -> int | None:
    """The smallest look above n seeds (None past the last one)."""
    return next((k for k in design.looks if k > n), None)


def plan(table: pd.DataFrame, specs: dict[str, Spec], design: Design, budget: Budget,
         runs_per_seed: dict[tuple[str, str], int], seeds_now: dict[tuple[str, str], int],
         minutes_left: float | None = None) -> tuple[list[Step], dict[tuple[str, str], int]]:
    """The next round: steps in the order taken, and the seeds each (grid, block) should
    reach. ``table``: evaluate()'s rows; ``runs_per_seed``: runs one seed of a block trains;
    ``seeds_now``: seeds each block has; ``minutes_left``: the budget not yet spent."""
    left = budget.cpu_minutes if minutes_left is None else minutes_left
    target = dict(seeds_now)

    def cost(grid: str, blocks: tuple[str, ...], to: int) -> float:  # blocks already at `to` are free
        return sum(max(0, to - target.get((grid, b), 0)) * runs_per_seed.get((grid, b), 0) * budget.per_run(grid, b)
                   for b in blocks)

    ranked = []  # tested claims by their p, then untested ones by cost
    for _, r in table.iterrows():
        spec = specs.get(r["claim"])
        n = int(r.get("n seeds", 0) or 0)
        to = next_look(n, design)
        if r["verdict"] != "inconclusive" or spec is None or not spec.decided_by or to is None:
            continue
        grid, blocks = spec.decided_by["grid"], tuple(spec.decided_by["runs"])
        p = r.get("p")
        tested = p is not None and math.isfinite(p)
        ranked.append((not tested, p if tested else cost(grid, blocks, to), r["claim"], n, to, grid, blocks))
    steps = []
    for _, _, claim, n, to, grid, blocks in sorted(ranked):
        minutes = cost(grid, blocks, to)
        if minutes > left:
            continue
        for b in blocks:
            target[(grid, b)] = max(target.get((grid, b), 0), to)
        left -= minutes
        steps.append(Step(claim, grid, blocks, n, to, round(minutes, 2)))
    return steps, {k: v for k, v in target.items() if v > seeds_now.get(k, 0)}


def runs_per_seed(grid) -> dict[tuple[str, str], int]:
    """(grid, block) -> the runs one seed of that block trains (a ``mor.grids.Grid``)."""
    base = min(r.config.train.seed for r in grid.runs)
    out: dict[tuple[str, str], int] = {}
    for r in grid.runs:
        if r.config.train.seed == base:
            out[(grid.name, r.block)] = out.get((grid.name, r.block), 0) + 1
    return out


def seeds_built(grid, frame: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(grid, block) -> how many seeds of that block have every run in the results frame."""
    have = set(frame["run_id"]) if frame is not None else set()
    per: dict[tuple[str, str], dict[int, list[bool]]] = {}
    for r in grid.runs:
        per.setdefault((grid.name, r.block), {}).setdefault(r.config.train.seed, []).append(r.run_id in have)
    return {k: sum(all(v) for v in seeds.values()) for k, seeds in per.items()}


def write_grids(src: Path, out: Path, target: dict[tuple[str, str], int], mode: str) -> list[Path]:
    """A copy of the grids folder ``src`` at ``out`` whose grids named in ``target`` repeat
    their runs to the most seeds any of their blocks needs (``modes.<mode>.seeds``; the grid
    loader repeats whole grids, not blocks). Run ids of the seeds already trained are
    unchanged (an id hashes one run's config, not the seed count), so a workflow pointed at
    ``out`` (``--config grids_dir=out``) trains only the new seeds."""
    src, out = Path(src), Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    seeds: dict[str, int] = {}
    for (grid, _), n in target.items():
        seeds[grid] = max(seeds.get(grid, 0), n)
    written = []
    for grid, n in sorted(seeds.items()):
        path = out / f"{grid}.yaml"
        raw = yaml.safe_load(path.read_text())
        raw["modes"][mode]["seeds"] = n
        path.write_text(f"# generated by mor.claims.seeding from {src / path.name}: modes.{mode}.seeds = {n}\n"
                        + yaml.safe_dump(raw, sort_keys=False))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    """``python -m mor.claims.seeding --results results``: the next round of the adaptive
    design for the results at hand (which blocks of which grids need how many seeds)."""
    import argparse

    from mor.claims.registry import load_specs
    from mor.claims.render import load_frames
    from mor.claims.verdict import evaluate
    from mor.grids import load_grid

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--results", default="results")
    ap.add_argument("--grids", default=str(SPEC_FILE.parents[1]))
    ap.add_argument("--mode", default="local")
    ap.add_argument("--minutes-left", type=float, default=None, help="CPU minutes not yet spent (default: the budget)")
    ap.add_argument("--write-grids", default=None, help="a folder: a copy of --grids with the planned seeds, for "
                                                        "snakemake --config grids_dir=<folder>")
    a = ap.parse_args(argv)
    design, specs = load_specs()
    budget = load_budget()
    names = sorted({s.decided_by["grid"] for s in specs.values()})
    frames = load_frames(Path(a.results), set(names))
    rps, now = {}, {}
    for g in names:
        grid = load_grid(Path(a.grids) / f"{g}.yaml", a.mode)
        rps.update(runs_per_seed(grid))
        now.update(seeds_built(grid, frames.get(g)))
    steps, target = plan(evaluate(frames), specs, design, budget, rps, now, a.minutes_left)
    for s in steps:
        print(f"{s.claim}: {s.grid} [{', '.join(s.blocks)}] {s.seeds_from} -> {s.seeds_to} seeds, +{s.minutes:.1f} CPU min")
    for (g, b), n in sorted(target.items()):
        print(f"set {g}.yaml block {b} to {n} seeds")
    if not steps:
        print("nothing to add: every claim is decided, past its last look, or out of budget")
    elif a.write_grids:
        for path in write_grids(Path(a.grids), Path(a.write_grids), target, a.mode):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
