"""Which grids ``mor status`` shows: Snakemake targets, grid names or files resolved to grids,
with the seeds the claims' adaptive design has added so far.
"""

from __future__ import annotations

from pathlib import Path

from mor.grids import Grid, GridError, all_grids, load_grid
from mor.layout import RUNS


def resolve_targets(targets: list[str], grids_dir: Path, mode: str) -> list[Grid]:
    """Grids for Snakemake targets (tables/x, figures/y, paper), grid names or grid files, or
    runs (``runs/<id>``, ``<grid>/<id>``, a bare id; any unique prefix of the id: that
    grid with those runs alone); none = every grid that lists an artifact."""
    grids = {p.stem: load_grid(p, mode) for p in all_grids(grids_dir)}
    by_artifact = {a: g.name for g in grids.values() for a in g.artifacts}
    picked: list[str] = []
    only: dict[str, set[str]] = {}  # grid -> the runs a run target asked for (a grid target: all)
    for t in targets or ["paper"]:
        run = _run_target(t, grids, mode)
        if run is not None:
            name, rid = run
            if name not in picked:
                picked.append(name)
                only[name] = set()
            if name in only:
                only[name].add(rid)
            continue
        t = t.rstrip("/")
        if t in ("paper", "all"):
            names = [g.name for g in grids.values() if g.artifacts]
        elif t in by_artifact:
            names = [by_artifact[t]]
        elif t in grids:
            names = [t]
        elif t.endswith(".yaml") and Path(t).exists():
            g = load_grid(t, mode)
            grids.setdefault(g.name, g)
            names = [g.name]
        else:
            raise GridError(f"unknown target {t!r}: not an artifact of a grid in {grids_dir} ({sorted(by_artifact)}), "
                            f"a grid name ({sorted(grids)}), a grid file or 'paper'")
        picked += [n for n in names if n not in picked]
        for n in names:
            only.pop(n, None)
    return [_only(grids[n], only[n]) if n in only else grids[n] for n in picked]


def _run_target(t: str, grids: dict[str, Grid], mode: str) -> tuple[str, str] | None:
    """(grid, run id) for a run target: ``runs/<id>`` (its folder), ``<grid>/<id>`` or a bare id
    (``runs/<grid>/<id>`` of the layout before, too), the id any unique prefix (what the narrow
    table shows); a run several grids list is shown under the first; None for a target that
    names no run."""
    parts = [p for p in t.rstrip("/").split("/") if p]
    folder = parts[:1] == [RUNS]  # runs/<id> (its one home), or runs/<grid>/<id> of the layout before
    if folder:
        parts = parts[1:]
    if len(parts) == 2 and parts[0] in grids:
        return parts[0], grids[parts[0]].find(parts[1]).run_id
    if len(parts) == 1 and folder:
        t = parts[0]
    if len(parts) != 1 or t in grids or t in ("paper", "all") or t.endswith(".yaml") or "/" in t:
        return None
    hits = [(g.name, r.run_id) for g in grids.values() for r in g.runs if r.run_id.startswith(t)]
    if len({h[1] for h in hits}) > 1 and len({h[0] for h in hits}) > 1:
        raise GridError(f"run id prefix {t!r} is ambiguous in mode {mode!r}: runs of "
                        f"{sorted({h[0] for h in hits})} start with it; name the grid: <grid>/{t}")
    return (hits[0][0], grids[hits[0][0]].find(t).run_id) if hits else None


def _only(grid: Grid, run_ids: set[str]) -> Grid:
    import dataclasses

    return dataclasses.replace(grid, runs=tuple(r for r in grid.runs if r.run_id in run_ids),
                               others=tuple(r.run_id for r in grid.runs if r.run_id not in run_ids))


def with_design_seeds(grids: list[Grid], results: Path) -> list[Grid]:
    """The grids with the seeds the claims' adaptive design has added so far: the latest
    ``results/claims/round<r>/plan.json`` (workflows/rules/claims.smk) names, per grid and block,
    the seeds its next round trains, so those runs are listed too (as not started until
    they run)."""
    import json

    plans = [p for p in (results / "claims").glob("round*/plan.json") if p.parent.name[5:].isdigit()]
    plans.sort(key=lambda p: int(p.parent.name[5:]))
    if not plans:
        return grids
    try:
        seeds = json.loads(plans[-1].read_text())["seeds"]
    except (OSError, ValueError, KeyError) as e:
        raise GridError(f"{plans[-1]}: not a round plan of the claims' design ({e})") from None
    from mor.claims.registry import load_specs, spec_for
    from mor.claims.rounds import round_grid

    out = []
    for g in grids:  # as the round loads it: the pilot's seeds below the design's first fresh one skipped
        first_seed = load_specs(spec_for(g.path.parent), mode=g.mode)[0].first_seed
        out.append(round_grid(g.path, g.mode, seeds[g.name], first_seed) if seeds.get(g.name) else g)
    return out
