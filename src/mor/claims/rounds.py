"""A round of the claims' adaptive design from the files on disk, and its command.

``python -m mor.claims.rounds --results DIR --out plan.json [--previous plan.json]`` is the
Snakemake checkpoint ``seeding`` (workflows/rules/claims.smk): it reads the round's
``<grid>.parquet``, the grids at the seeds the last round asked for and the pre-registered
budget, hands them to ``mor.claims.seeding.next_round`` (the rule itself, pure) and writes the
record as ``results/claims/round<r>/plan.json``. By hand it shows what the next round adds.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from mor.claims.registry import SPEC_FILE
from mor.claims.seeding import Budget, next_round, round_grids, seed_offsets

BUDGET_KEYS = {"local": ("local_cpu_minutes", "minutes_per_run", "CPU min"),
               "cluster": ("cluster_gpu_hours", "gpu_hours_per_run", "GPU-h")}


def load_budget(path: Path = SPEC_FILE, mode: str = "local") -> Budget:
    """The mode's budget; a missing key is an error naming the file and the key."""
    total_key, per_key, unit = BUDGET_KEYS[mode]
    b = yaml.safe_load(Path(path).read_text())["design"]["budget"]
    for key in (total_key, per_key):
        if key not in b:
            raise ValueError(f"{path}: design.budget.{key} is missing (the {mode} mode's budget)")
    if "default" not in b[per_key]:
        raise ValueError(f"{path}: design.budget.{per_key} needs a 'default'")
    return Budget(float(b[total_key]), {k: float(v) for k, v in b[per_key].items()}, unit)


@functools.lru_cache(maxsize=None)
def own_seeds(path: str, mode: str) -> int:
    """The seeds a grid's mode gives every block (``modes.<mode>.seeds``), from the file alone."""
    from mor.grids import mode_settings

    return int(mode_settings(path, mode).get("seeds", 1))


def round_grid(path: Path, mode: str, reach: dict[str, int] | None, first_seed: int = 0):
    """A grid as a round of the design loads it: each block named in ``reach`` (a plan.json's
    ``seeds`` of the grid) at ``seed_offsets``, every other block at the mode's own seeds. The
    one conversion the workflow (common.smk), ``run_round`` and the null simulations share."""
    from mor.grids import load_grid

    if not reach:
        return load_grid(path, mode)
    own = own_seeds(str(path), mode)
    return load_grid(path, mode, seeds={b: seed_offsets(own, int(n), first_seed) for b, n in reach.items()})


def run_round(results_dir: Path, grids_dir: Path, mode: str, previous: dict | None = None,
              analyses_dir: Path | None = None, budget: Budget | None = None, spec: Path = SPEC_FILE) -> dict:
    """One round of the adaptive design, as a JSON-able record (the Snakemake checkpoint
    ``seeding`` writes it as ``results/claims/round<r>/plan.json``).

    ``results_dir`` holds the round's ``<grid>.parquet`` (the grids' runs, with the seeds
    ``previous`` asked for); ``previous`` is the last round's record (None for round 0, the
    grids' own seeds). The record says which claims are decided, the reach each raised block
    should have next (cumulative over rounds; ``seeds``: grid -> block -> reach, whose seeds
    ``seed_offsets`` lists: a pilot's gap is skipped), the budget planned so far, and whether
    the design stops here, and why (``next_round``; this reads the files it needs).
    ``spec``: the pre-registered design file (design, budget, family)."""
    from mor.claims.registry import load_family, load_specs
    from mor.claims.render import load_frames

    design, specs = load_specs(spec, mode=mode)
    budget = budget or load_budget(spec, mode=mode)
    so_far: dict[str, dict[str, int]] = (previous or {}).get("seeds", {})
    names = round_grids(specs, previous)
    frames = load_frames(Path(results_dir), set(names), analyses_dir)
    grids = {g: round_grid(Path(grids_dir) / f"{g}.yaml", mode, so_far.get(g), design.first_seed)
             for g in names if (Path(grids_dir) / f"{g}.yaml").exists()}
    return next_round(frames, grids, design, specs, budget, previous, load_family(mode, spec))


def _spans(offsets: list[int]) -> str:
    """[0, 1, 2, 9, 10, 11] -> '0-2, 9-11'."""
    spans: list[list[int]] = []
    for k in offsets:
        if spans and k == spans[-1][1] + 1:
            spans[-1][1] = k
        else:
            spans.append([k, k])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def main(argv: list[str] | None = None) -> None:
    """``python -m mor.claims.rounds --results DIR --out plan.json [--previous plan.json]``:
    one round of the adaptive design for the results at hand (the Snakemake checkpoint
    ``seeding``, workflows/rules/claims.smk, runs it; by hand it shows what the next round adds)."""
    import argparse
    import json

    from mor.atomic import write_json_atomic

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--results", default="results", help="folder of the round's <grid>.parquet")
    ap.add_argument("--analyses", default=None, help="folder of runs/<run>.depth_cap.npz (default: --results)")
    ap.add_argument("--grids", default=str(SPEC_FILE.parents[1]))
    ap.add_argument("--mode", default="local")
    ap.add_argument("--previous", default=None, help="the last round's plan.json (none: this is round 0)")
    ap.add_argument("--spec", default=str(SPEC_FILE), help="the pre-registered design (default: the shipped one)")
    ap.add_argument("--out", default=None, help="write the round's record here (JSON)")
    a = ap.parse_args(argv)
    previous = json.loads(Path(a.previous).read_text()) if a.previous else None
    record = run_round(Path(a.results), Path(a.grids), a.mode, previous, Path(a.analyses) if a.analyses else None,
                       spec=Path(a.spec))
    for x in record["ranking"]:
        print(f"rank {x['claim']}: {x['seeds_from']} -> {x['seeds_to']} seeds, {x['cost']:g} {record['unit']} / chance "
              + (f"{x['chance']:.3f}" if x["chance"] is not None else "(no estimate: 1)")
              + f" = {x['cost_per_decision']:g} a decision" + ("" if x["funded"] else ", not funded"))
    for s in record["steps"]:
        print(f"{s['claim']}: {s['grid']} [{', '.join(s['blocks'])}] {s['seeds_from']} -> {s['seeds_to']} seeds, "
              f"+{s['cost']:.1f} {record['unit']}")
    from mor.claims.registry import load_specs

    first_seed = load_specs(Path(a.spec), mode=a.mode)[0].first_seed
    for g, blocks in sorted(record["seeds"].items()):
        own = own_seeds(str(Path(a.grids) / f"{g}.yaml"), a.mode)
        for b, n in sorted(blocks.items()):
            offsets = seed_offsets(own, n, first_seed)
            print(f"{g} block {b}: {len(offsets)} seeds (offsets {_spans(offsets)})")
    print(f"round {record['round']}: " + ("stop: " + record["why"] if record["stop"] else "another round follows"))
    if a.out:
        write_json_atomic(a.out, record)


if __name__ == "__main__":
    main()
