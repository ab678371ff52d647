"""Which grids ``mor status`` shows: Snakemake targets, grid names or files resolved to grids,
with the seeds the claims' adaptive design has added so far.
"""

from __future__ import annotations

from pathlib import Path

from mor.grids import Grid, GridError, all_grids, load_grid


def resolve_targets(targets: list[str], grids_dir: Path, mode: str) -> list[Grid]:
    """Grids for Snakemake targets (tables/x, figures/y, paper), grid names or grid files;
    none = every grid that lists an artifact."""
    grids = {p.stem: load_grid(p, mode) for p in all_grids(grids_dir)}
    by_artifact = {a: g.name for g in grids.values() for a in g.artifacts}
    picked: list[str] = []
    for t in targets or ["paper"]:
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
    return [grids[n] for n in picked]


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
    from mor.claims.seeding import round_grid

    out = []
    for g in grids:  # as the round loads it: the pilot's seeds below the design's first fresh one skipped
        first_seed = load_specs(spec_for(g.path.parent), mode=g.mode)[0].first_seed
        out.append(round_grid(g.path, g.mode, seeds[g.name], first_seed) if seeds.get(g.name) else g)
    return out
