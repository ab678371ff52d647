"""``python -m mor migrate-runs`` (issue 58): runs of the layout before, ``runs/<grid>/<run_id>``,
move once to their one home ``runs/<run_id>``, with their analysis files and their own jobs'
logs; nothing is retrained (the moved folder is byte for byte the old one), nothing is deleted
that the migration did not move, and two different copies of one id stop it before it moves anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mor import layout
from mor.cli import main
from mor.migrate import MigrateError, migrate


def old_run(root: Path, grid: str, run_id: str, loss: float = 1.0) -> Path:
    d = layout.legacy_run_dir(root / layout.RUNS, grid, run_id)
    (d / layout.FINAL_DIR).mkdir(parents=True)
    (d / layout.CONFIG_FILE).write_text(json.dumps({"run_id": run_id}))
    (d / layout.SUMMARY_FILE).write_text(json.dumps({"final_loss": loss}))
    (d / layout.FINAL_DIR / layout.WEIGHTS_FILE).write_bytes(b"w" * 64)
    return d


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_runs_move_to_their_one_home_with_their_own_files(tmp_path):
    a = old_run(tmp_path, "table10", "r-1")
    before = tree(a)
    old_run(tmp_path, "table15", "r-1")  # the same run trained again for a second grid, the same bytes
    old_run(tmp_path, "table15", "r-2", loss=2.0)
    side = layout.legacy_sidecar_file(tmp_path / layout.RESULTS, "table15", "r-2", "kv")
    side.parent.mkdir(parents=True)
    side.write_bytes(b"npz")
    row = layout.row_file(tmp_path / layout.RESULTS, "table15", "r-2")
    row.write_bytes(b"row")
    train_log = tmp_path / layout.LOGS / "table10" / "r-1" / "train.log"
    eval_log = tmp_path / layout.LOGS / "table10" / "r-1" / "eval.log"
    train_log.parent.mkdir(parents=True)
    train_log.write_text("trained\n")
    eval_log.write_text("scored\n")
    record = layout.legacy_job_folder(tmp_path / layout.SLURM_LOGS, "table15", "r-2", "train") / layout.JOB_RECORD_FILE
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"job_id": "7"}))

    plan = migrate(tmp_path, slurm_query=lambda j: type("S", (), {"state": "COMPLETED"})())

    home = layout.RunPaths.own("r-1", tmp_path)
    assert tree(home.dir) == before  # moved, not rewritten: nothing to retrain
    assert json.loads(layout.RunPaths.own("r-2", tmp_path).summary.read_text())["final_loss"] == 2.0
    assert layout.RunPaths.own("r-2", tmp_path).sidecar("kv").read_bytes() == b"npz" and not side.exists()
    assert row.read_bytes() == b"row"  # the grid's own file stays the grid's
    assert layout.run_log(tmp_path / layout.LOGS, "table10", "r-1", "train").read_text() == "trained\n"
    assert eval_log.read_text() == "scored\n"  # the eval job is the grid's: its log stays
    assert (layout.job_folder(tmp_path / layout.SLURM_LOGS, "table15", "r-2", "train") / layout.JOB_RECORD_FILE).exists()
    # the identical second copy is left where it was, named, never deleted
    dup = layout.legacy_run_dir(tmp_path / layout.RUNS, "table15", "r-1")
    assert tree(dup) == before and (dup, home.dir) in [(x, y) for x, y in plan.duplicates]
    assert not (tmp_path / layout.RUNS / "table10").exists()  # emptied by its own move
    assert migrate(tmp_path).moves == []  # once: a second call finds nothing to move


def test_two_different_copies_of_one_run_move_nothing(tmp_path, capsys):
    a = old_run(tmp_path, "table10", "r-1", loss=1.0)
    b = old_run(tmp_path, "table15", "r-1", loss=1.5)
    c = old_run(tmp_path, "table15", "r-3")
    with pytest.raises(MigrateError, match="nothing was moved: two different copies of one run"):
        migrate(tmp_path)
    assert a.is_dir() and b.is_dir() and c.is_dir() and not (tmp_path / layout.RUNS / "r-3").exists()
    assert main(["migrate-runs", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "table15/r-1 differs from" in err and "runs/table10/r-1" in err


def test_a_queued_slurm_job_moves_nothing_and_a_dry_run_moves_nothing(tmp_path):
    d = old_run(tmp_path, "table10", "r-1")
    record = layout.legacy_job_folder(tmp_path / layout.SLURM_LOGS, "table10", "r-1", "train") / layout.JOB_RECORD_FILE
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"job_id": "9"}))
    with pytest.raises(MigrateError, match="Slurm job 9 PENDING"):
        migrate(tmp_path, slurm_query=lambda j: type("S", (), {"state": "PENDING"})())
    plan = migrate(tmp_path, dry_run=True, slurm_query=lambda j: type("S", (), {"state": "COMPLETED"})())
    assert (d, layout.run_dir(tmp_path / layout.RUNS, "r-1")) in plan.moves and d.is_dir()
    assert not layout.run_dir(tmp_path / layout.RUNS, "r-1").exists()
