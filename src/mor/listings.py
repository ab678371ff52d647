"""Which grids list a run, and which listing a run's own jobs read: one run id, one home.

A run id is the identity of what it trains (``mor.identity``), so however many grids list it,
its train, lm-eval, throughput and analysis jobs run once, in ``runs/<run_id>/`` (``mor.layout``),
and its eval job once per distinct eval settings (``RunConfig.eval_hash``); only its result row is
each grid's (``layout.GRID_KINDS``). A run's own job reads its config from one listing, its
*home*: the first grid by name that needs the job (``needs``: for ``lmeval``, the first whose
run scores lm-eval tasks; for ``eval``, the first that lists it with those eval settings; for an
analysis, the first whose figures draw it). The listings that need one of its other jobs must
agree on that job's settings, or the grids are refused with one line naming both. The workflow
(``workflows/rules/common.smk``), the launcher given a grids folder (``mor.launch``), the plan and
``mor status`` all ask this module.
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
    analyses: tuple[str, ...] = ()  # the analyses its grid draws of this run (mor.analysis.sidecar)


def listings(grids: Iterable[Grid]) -> dict[str, list[Listing]]:
    """run id -> its listings, grids by name (every run of each grid, whatever its tags)."""
    from mor.analysis.sidecar import ARTIFACT_ANALYSES, applies

    out: dict[str, list[Listing]] = {}
    for g in sorted(grids, key=lambda g: g.name):
        drawn = sorted({ARTIFACT_ANALYSES[a] for a in g.artifacts if a in ARTIFACT_ANALYSES})
        for r in g.runs:
            out.setdefault(r.run_id, []).append(Listing(g.name, r, tuple(a for a in drawn if applies(a, r.config))))
    return out


PER_SETTINGS = ("eval",)  # kinds with one job per distinct settings of a run (its eval hash), not one per run


def needs(kind: str, x: Listing, which: str = "") -> bool:
    """Whether listing ``x`` asks for a run's own job of ``kind`` and so may lend it its settings.
    lmeval: the run scores tasks there; analysis: the grid draws analysis ``which`` of the run
    (any, when ''); eval: the listing's eval settings have hash ``which`` (any, when '')."""
    cfg = x.run.config
    if kind == "lmeval":
        return bool(cfg.eval.lm_eval_tasks)
    if kind == "analysis":
        return which in x.analyses if which else bool(x.analyses)
    if kind in PER_SETTINGS:
        return not which or cfg.eval_hash == which
    return True


def home(listed: list[Listing], kind: str, which: str = "") -> Listing:
    """The listing a run's own job of ``kind`` reads its config from: the first that needs it
    (``needs``; ``which``: an eval job's eval hash, an analysis job's analysis), else the first."""
    if kind in GRID_KINDS:
        raise ValueError(f"a {kind} job is each grid's, not the run's own: no home listing")
    match = [x for x in listed if needs(kind, x, which)]
    if kind in PER_SETTINGS and which and not match:
        raise GridError(f"run {listed[0].run.run_id}: no grid lists it with eval settings {which} "
                        f"(grids {', '.join(x.grid for x in listed)} list it with "
                        f"{', '.join(sorted({x.run.config.eval_hash for x in listed}))})")
    return match[0] if match else listed[0]


def check_agree(by_id: dict[str, list[Listing]], mode: str, kinds: Iterable[str]) -> None:
    """The listings of each shared run that need its own job of a kind of ``kinds`` (``needs``)
    agree on that job's settings (``mor.jobs.KINDS[k].settings_of``): one job serves them all.
    Else a GridError naming both. An eval job is one per distinct settings, never refused."""
    from mor.analysis.sidecar import ANALYSES
    from mor.jobs import KINDS

    for run_id, listed in by_id.items():
        if len(listed) < 2:
            continue
        for kind in kinds:
            if kind in GRID_KINDS or kind in PER_SETTINGS or KINDS[kind].settings is None:
                continue
            for which in (ANALYSES if kind == "analysis" else ("",)):
                wildcards = {"run_id": run_id, "analysis": which}
                keyed = [(x.grid, json.dumps(KINDS[kind].settings_of(x.run.config, mode, wildcards), sort_keys=True))
                         for x in listed if needs(kind, x, which)]
                for grid, key in keyed[1:]:
                    if key != keyed[0][1]:
                        what = f"{kind} ({which})" if which else kind
                        raise GridError(f"run {run_id}: grids {keyed[0][0]} and {grid} list it with different {what} "
                                        f"settings ({keyed[0][1]} vs {key}); one run has one {what} job: give the two "
                                        "the same settings")


def grids_of(by_id: dict[str, list[Listing]], run_id: str) -> list[str]:
    return [x.grid for x in by_id.get(run_id, [])]


def home_of(grids: dict[str, Grid], by_id: dict[str, list[Listing]], run_id: str, kind: str,
            which: str = "") -> tuple[Grid, Run]:
    """(home grid, run) of ``run_id``'s own job of ``kind`` (``which``: an eval job's eval hash, an
    analysis job's analysis): its home listing, or for a seed no grid lists (one the claims'
    design added, ``Grid.run``) the first grid by name that has it (with that eval hash)."""
    listed = by_id.get(run_id)
    if listed:
        x = home(listed, kind, which)
        return grids[x.grid], x.run
    for name in sorted(grids):
        try:
            run = grids[name].run(run_id)
        except GridError:
            continue
        if kind not in PER_SETTINGS or not which or run.config.eval_hash == which:
            return grids[name], run
    settings = f" with eval settings {which}" if kind in PER_SETTINGS and which else ""
    raise GridError(f"no grid lists run {run_id!r}{settings} (grids: {', '.join(sorted(grids))})")


def find_home(grids_dir: str | Path, mode: str, run_id: str, kind: str, which: str = "") -> Grid:
    """The home grid of ``run_id``'s job of ``kind`` (``which``: as ``home_of``) among the grid
    files of ``grids_dir`` (the launcher given a folder of grids, as the workflow's rules of a
    run's own jobs give it)."""
    grids = {g.name: g for g in (load_grid(p, mode) for p in all_grids(Path(grids_dir)))}
    return home_of(grids, listings(grids.values()), run_id, kind, which)[0]
