"""``python -m mor migrate-runs``: a results folder of the layout before one home per run moved
into it, once: nothing retrained, nothing lost.

Before issue 58 a run lived under each grid that listed it, ``runs/<grid>/<run_id>``; now it has
one home, ``runs/<run_id>`` (``mor.layout``). This moves, by renames on the same file system:

    runs/<grid>/<run_id>/                        -> runs/<run_id>/
    results/runs/<grid>/<run_id>.<a>.npz         -> results/runs/<run_id>.<a>.npz
    logs/<grid>/<run_id>/<job>.log               -> logs/runs/<run_id>/<job>.log
    logs/slurm/<grid>/<run_id>/<kind>/           -> logs/slurm/runs/<run_id>/<kind>/

except what stays the grid's (the result row), which is already where the new layout looks.

A run is also scored once per distinct eval settings (``runs/<run_id>/eval/<eval_hash>.parquet``,
the eval job's measurement; each grid's row is copied from it). A folder made before that has only
the rows, each the measurement of its grid's eval settings, so the migration copies each row that
has no measurement yet to the measurement of its eval settings (``results/runs/<grid>/<run_id>.parquet``
-> ``runs/<run_id>/eval/<eval_hash>.parquet``, the hash from the row's own config, the file's time
kept): nothing already evaluated is evaluated again. A row of another results schema is not
copied (its eval re-runs, as a schema change always made it) nor one whose run folder is gone.

Two copies of one id (two grids each trained it, or one is already at its home) that are the
same, file for file, byte for byte: the first moves, the other stays where it is and is named
(delete it by hand). Copies that differ: nothing at all is moved, and the command names both:
keep one (move the other out of ``runs/``) and run it again. It also refuses while a workflow
runs in this folder or a recorded Slurm job of a run is queued or running (a job writes to the
folder it was given). It deletes nothing but the folders its own moves left empty.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mor import layout
from mor.workflow_guard import workflow_alive


class MigrateError(RuntimeError):
    pass


def is_run_folder(d: Path) -> bool:
    """A run's folder (anything a train job writes first), of either layout."""
    f = layout.RunPaths.of(d)
    return d.is_dir() and (f.config.exists() or f.train_log.exists() or f.checkpoints.is_dir() or f.final.is_dir())


def legacy_runs(root: Path) -> list[tuple[str, str]]:
    """(grid, run id) of every run folder of the layout before under ``root/runs``."""
    runs = root / layout.RUNS
    if not runs.is_dir():
        return []
    out = []
    for g in sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".") and not is_run_folder(p)):
        out += [(g.name, d.name) for d in sorted(g.iterdir()) if not d.name.startswith(".") and is_run_folder(d)]
    return out


def same_tree(a: Path, b: Path) -> bool:
    """The same files under both folders, byte for byte."""
    files = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    if files != {p.relative_to(b) for p in b.rglob("*") if p.is_file()}:
        return False
    return all(filecmp.cmp(a / f, b / f, shallow=False) for f in files)


@dataclass
class Plan:
    moves: list[tuple[Path, Path]] = field(default_factory=list)  # (from, to)
    duplicates: list[tuple[Path, Path]] = field(default_factory=list)  # (left in place, the same as)
    conflicts: list[tuple[Path, Path]] = field(default_factory=list)
    kept_logs: list[tuple[Path, Path]] = field(default_factory=list)  # a log of the same job of a second copy: left
    measurements: list[tuple[Path, Path]] = field(default_factory=list)  # (a grid's row, its run's eval measurement): copied


def _add(plan: Plan, src: Path, dst: Path, taken: dict[Path, Path], log: bool = False) -> None:
    """Move ``src`` to ``dst`` unless ``dst`` is (or will be) another copy: the same -> a
    duplicate left in place; different -> a conflict (a log: left in place, named)."""
    other = taken.get(dst) or (dst if dst.exists() else None)
    if other is None:
        plan.moves.append((src, dst))
        taken[dst] = src
    elif (same_tree(src, other) if src.is_dir() else filecmp.cmp(src, other, shallow=False)):
        plan.duplicates.append((src, dst))  # the same as what is (or will be) at its home
    else:
        (plan.kept_logs if log else plan.conflicts).append((src, other))


def plan_migration(root: str | Path = ".") -> Plan:
    root = Path(root)
    plan, taken = Plan(), {}
    for grid, run_id in legacy_runs(root):
        _add(plan, layout.legacy_run_dir(root / layout.RUNS, grid, run_id), layout.run_dir(root / layout.RUNS, run_id), taken)
    old_results = root / layout.RESULTS / layout.RUNS
    for g in sorted(p for p in old_results.iterdir() if p.is_dir()) if old_results.is_dir() else []:
        for f in sorted(g.glob("*.npz")):
            run_id, _, analysis = f.name[:-len(".npz")].rpartition(".")
            _add(plan, f, layout.sidecar_file(root / layout.RESULTS, run_id, analysis), taken)
    for logs, target in ((root / layout.LOGS, lambda g, r, p: layout.run_log(root / layout.LOGS, g, r, p.stem)),
                         (root / layout.SLURM_LOGS, lambda g, r, p: layout.job_folder(root / layout.SLURM_LOGS, g, r, p.name))):
        for grid, run_id in dict.fromkeys(legacy_runs(root) + _legacy_log_runs(logs)):
            folder = logs / grid / run_id
            for p in sorted(folder.iterdir()) if folder.is_dir() else []:
                if p.stem == "eval":  # the log / Slurm folder of a grid's eval job before: stays the grid's
                    continue
                dst = target(grid, run_id, p)
                if dst != p:
                    _add(plan, p, dst, taken, log=True)
    plan.measurements = _measurements(root, {dst for _, dst in plan.moves})
    return plan


def _measurements(root: Path, arriving: set[Path]) -> list[tuple[Path, Path]]:
    """(row, measurement) for each grid's row whose run (at its home, or moving there) has no eval
    measurement of the row's eval settings yet: the first row by path of each (run, settings)."""
    import pyarrow.parquet as pq

    from mor.identity import eval_hash_of
    from mor.results import RUN_SCHEMA

    old_results = root / layout.RESULTS / layout.RUNS
    out: dict[Path, Path] = {}
    for row in sorted(old_results.glob("*/*.parquet")) if old_results.is_dir() else []:
        home = layout.RunPaths.own(row.stem, root)
        if not (home.dir.is_dir() or home.dir in arriving):
            continue
        try:
            table = pq.read_table(row)
        except Exception:  # unreadable: the workflow re-runs its eval, as before
            continue
        if table.schema.remove_metadata() != RUN_SCHEMA.remove_metadata() or table.num_rows != 1:
            continue
        (r,) = table.to_pylist()
        if r["run_id"] != row.stem:
            continue
        dst = home.measurement(eval_hash_of(json.loads(r["config_json"])))
        if not dst.exists():
            out.setdefault(dst, row)
    return [(row, dst) for dst, row in out.items()]


def _legacy_log_runs(logs: Path) -> list[tuple[str, str]]:
    """(grid, run id) of log folders of the layout before (their run folder may be gone)."""
    skip = {layout.RUNS, "slurm", "data", "claims", "report", "rehearsal"}
    if not logs.is_dir():
        return []
    return [(g.name, d.name) for g in sorted(logs.iterdir()) if g.is_dir() and g.name not in skip
            for d in sorted(g.iterdir()) if d.is_dir()]


def _in_flight(plan: Plan, query=None) -> list[str]:
    """Recorded Slurm jobs among the moves still queued or running."""
    from mor.launch.slurm_state import QUEUED_STATES, RUNNING_STATES
    from mor.status.read import slurm_job_state

    out = []
    for src, _ in plan.moves:
        record = src / layout.JOB_RECORD_FILE
        if record.exists():
            state = slurm_job_state(record, query)
            if state and state[0] in (*QUEUED_STATES, *RUNNING_STATES):
                out.append(f"{src} (Slurm job {state[1]} {state[0]})")
    return out


def migrate(root: str | Path = ".", dry_run: bool = False, slurm_query=None) -> Plan:
    """Move the layout before into one home per run (see the module docstring); the plan it carried out."""
    root = Path(root)
    if workflow_alive(root):
        raise MigrateError(f"{root.resolve()}: a Snakemake workflow is running here; let it finish (or stop it), "
                           "then migrate: nothing was moved")
    plan = plan_migration(root)
    if plan.conflicts:
        raise MigrateError("nothing was moved: two different copies of one run: " + "; ".join(
            f"{a} differs from {b}" for a, b in plan.conflicts)
            + ". Keep one: move the other out of runs/ (e.g. to runs.old/), then run migrate-runs again")
    busy = _in_flight(plan, slurm_query)
    if busy:
        raise MigrateError("nothing was moved: a recorded Slurm job is still queued or running: " + "; ".join(busy)
                           + ". Wait for it (or scancel it), then run migrate-runs again")
    if dry_run:
        return plan
    for src, dst in plan.moves:
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, dst)  # same file system: atomic, nothing copied
        for d in src.parents:  # the folders its own move left empty (runs/<grid>/, logs/<grid>/<id>/)
            if d == root or d in (root / layout.RUNS, root / layout.LOGS, root / layout.RESULTS):
                break
            try:
                d.rmdir()
            except OSError:
                break
    for row, dst in plan.measurements:  # copied, not moved: the row stays the grid's
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.copy2(row, tmp)  # its time kept: the row is not older than what it is now made from
        os.replace(tmp, dst)
    return plan


def main(root: str = ".", dry_run: bool = False) -> int:
    plan = migrate(root, dry_run)
    verb = "would move" if dry_run else "moved"
    for src, dst in plan.moves:
        print(f"{verb} {src} -> {dst}")
    for left, same in plan.duplicates:
        print(f"left {left}: the same as {same} (a second copy of one run; delete it by hand)")
    for left, other in plan.kept_logs:
        print(f"left {left}: a log of a second copy of one run's job ({other} moved); keep or delete it by hand")
    copy = "would copy" if dry_run else "copied"
    for row, dst in plan.measurements:
        print(f"{copy} {row} -> {dst} (its eval measurement: not evaluated again)")
    runs = sum(1 for src, _ in plan.moves if src.parent.parent.name == layout.RUNS)
    print(f"migrate-runs: {verb} {len(plan.moves)} ({runs} run folders), {len(plan.duplicates)} identical copies left "
          f"in place; {copy} {len(plan.measurements)} result rows to their runs' eval measurements")
    return 0
