"""``python -m mor migrate-runs`` (issue 58): runs of the layout before, ``runs/<grid>/<run_id>``,
move once to their one home ``runs/<run_id>``, with their analysis files and their own jobs'
logs; nothing is retrained (the moved folder is byte for byte the old one), nothing is deleted
that the migration did not move, and two different copies of one id stop it before it moves anything.
A grid's result row made before evals were the run's own becomes its run's eval measurement of
the row's eval settings (a copy), so nothing already evaluated is evaluated again."""

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


def old_row(root: Path, grid: str, run_id: str, eval_settings: dict, nll: float) -> Path:
    """A grid's result row as the eval job wrote it before issue 58's measurements."""
    from mor.results import write_rows

    row = layout.row_file(root / layout.RESULTS, grid, run_id)
    write_rows(row, [{"run_id": run_id, "grid": grid, "label": grid.upper(), "config_hash": "abc", "git_commit": "c0",
                      "scale": "tiny", "seed": 0, "val_nll": nll,
                      "config_json": json.dumps({"grid": grid, "eval": eval_settings})}])
    return row


def test_result_rows_become_their_runs_eval_measurements_and_nothing_is_evaluated_again(tmp_path, capsys):
    import os

    import pyarrow.parquet as pq

    from mor.identity import eval_hash_of

    old_run(tmp_path, "table10", "r-1")  # still of the layout before: it moves, its row's measurement lands with it
    same, other = {"nll_tokens": 2048, "batch": 8}, {"nll_tokens": 1024, "batch": 8}
    a = old_row(tmp_path, "table10", "r-1", same, 5.0)
    os.utime(a, (1_000_000, 1_000_000))
    old_row(tmp_path, "table15", "r-1", same, 5.0)  # the same run scored alike by a second grid: one measurement
    c = old_row(tmp_path, "table9", "r-1", other, 5.5)  # other eval settings: a measurement of their own
    old_row(tmp_path, "table10", "gone", same, 6.0)  # no run folder left: nothing to attach it to
    rows = {p: p.read_bytes() for p in (tmp_path / layout.RESULTS).rglob("*.parquet")}

    assert main(["migrate-runs", "--root", str(tmp_path)]) == 0
    assert "copied 2 result rows" in capsys.readouterr().out
    home = layout.RunPaths.own("r-1", tmp_path)
    h_same, h_other = eval_hash_of({"eval": same}), eval_hash_of({"eval": other})
    assert h_same != h_other
    assert sorted(p.name for p in (home.dir / layout.EVAL_DIR).iterdir()) == sorted([f"{h_same}.parquet", f"{h_other}.parquet"])
    assert pq.read_table(home.measurement(h_other)).to_pylist()[0]["val_nll"] == 5.5
    assert home.measurement(h_same).read_bytes() == a.read_bytes() and home.measurement(h_other).read_bytes() == c.read_bytes()
    assert home.measurement(h_same).stat().st_mtime == 1_000_000  # no newer than the row: the row is not redone
    assert {p: p.read_bytes() for p in rows} == rows  # every row stays the grid's, untouched
    assert not layout.RunPaths.own("gone", tmp_path).dir.exists()
    assert migrate(tmp_path).measurements == []  # once
