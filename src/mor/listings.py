"""Which grids list a run, and which listing a run's own jobs read: one run id, one home.

A run id is the identity of what it trains (``mor.identity``), so however many grids list it,
its train, lm-eval, throughput and analysis jobs run once, in ``runs/<run_id>/`` (``mor.layout``);
only its result row is each grid's (``layout.GRID_KINDS``). A run's own job reads its config
from one listing, its *home*: the first grid by name that needs the job (for ``lmeval``, the
first whose run scores lm-eval tasks). The listings must agree on that job's settings, or the
grids are refused with one line naming both. The workflow (``workflows/rules/common.smk``), the
launcher given a grids folder (``mor.launch``), the plan and ``mor status`` all ask this module.
Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from mor.grids import Grid, GridError, Run, all_grids, load_grid
from mor.layout import GRID_KINDS


@dataclass(frozen=True)
class Listing:
    grid: str  # the grid's name
    run: Run


def listings(grids: Iterable[Grid]) -> dict[str, list[Listing]]:
    """run id -> its listings, grids by name (every run of each grid, whatever its tags)."""
    out: dict[str, list[Listing]] = {}
    for g in sorted(grids, key=lambda g: g.name):
        for r in g.runs:
            out.setdefault(r.run_id, []).append(Listing(g.name, r))
    return out


def needs(kind: str, run: Run) -> bool:
    """Whether a listing asks a run's own job of ``kind`` to read its settings (lmeval: it scores tasks)."""
    return kind != "lmeval" or bool(run.config.eval.lm_eval_tasks)


def home(listed: list[Listing], kind: str) -> Listing:
    """The listing a run's own job of ``kind`` reads its config from (the first that needs it)."""
    if kind in GRID_KINDS:
        raise ValueError(f"a {kind} job is each grid's, not the run's own: no home listing")
    return next((x for x in listed if needs(kind, x.run)), listed[0])


def check_agree(by_id: dict[str, list[Listing]], mode: str, kinds: Iterable[str]) -> None:
    """The listings of each shared run agree on the settings of its own jobs of ``kinds``
    (``mor.jobs.KINDS[k].settings_of``): one job serves them all. Else a GridError naming both."""
    from mor.jobs import KINDS

    for run_id, listed in by_id.items():
        if len(listed) < 2:
            continue
        for kind in kinds:
            if kind in GRID_KINDS or KINDS[kind].settings is None:
                continue
            seen: dict[str, str] = {}
            for x in listed:
                if not needs(kind, x.run):
                    continue
                for analysis in (("depth_cap", "kv") if kind == "analysis" else ("",)):
                    key = json.dumps(KINDS[kind].settings_of(x.run.config, mode, {"run_id": run_id, "analysis": analysis}),
                                     sort_keys=True)
                    first = seen.setdefault(analysis, key)
                    if key != first:
                        other = next(y.grid for y in listed if needs(kind, y.run))
                        raise GridError(f"run {run_id}: grids {other} and {x.grid} list it with different {kind} settings "
                                        f"({first} vs {key}); one run has one {kind} job: give the two the same settings")


def grids_of(by_id: dict[str, list[Listing]], run_id: str) -> list[str]:
    return [x.grid for x in by_id.get(run_id, [])]


def home_of(grids: dict[str, Grid], by_id: dict[str, list[Listing]], run_id: str, kind: str) -> tuple[Grid, Run]:
    """(home grid, run) of ``run_id``'s own job of ``kind``: its home listing, or for a seed no
    grid lists (one the claims' design added, ``Grid.run``) the first grid by name that has it."""
    listed = by_id.get(run_id)
    if listed:
        x = home(listed, kind)
        return grids[x.grid], x.run
    for name in sorted(grids):
        try:
            return grids[name], grids[name].run(run_id)
        except GridError:
            continue
    raise GridError(f"no grid lists run {run_id!r} (grids: {', '.join(sorted(grids))})")


def find_home(grids_dir: str | Path, mode: str, run_id: str, kind: str) -> Grid:
    """The home grid of ``run_id``'s job of ``kind`` among the grid files of ``grids_dir`` (the
    launcher given a folder of grids, as the workflow's rules of a run's own jobs give it)."""
    grids = {g.name: g for g in (load_grid(p, mode) for p in all_grids(Path(grids_dir)))}
    return home_of(grids, listings(grids.values()), run_id, kind)[0]
