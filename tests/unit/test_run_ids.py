"""Run ids that paste, paths that say what they are, exports that neither overwrite nor hide
(issue 45, items 4 and 7): a run id is taken by any unique prefix (what ``mor status`` shows)
by the grid (the launcher's commands) and by ``export-hf``; an ambiguous prefix lists the
candidates; a path that is no run names what it found; a non-empty destination is refused
unless --force; the export's weights get the umask's mode."""

import json
import os
import stat
import subprocess
import sys

import pytest
from safetensors.torch import save_file

from helpers.paths import REPO
from helpers.tiny import VOCAB, tiny_run
from mor.cli import main
from mor.config import model_shape
from mor.grids import GridError, load_grid
from mor.status import short_ids

TABLE10 = REPO / "grids" / "table10.yaml"


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_the_grid_takes_every_short_id_status_shows_and_lists_an_ambiguous_prefix():
    grid = load_grid(TABLE10, "local")
    ids = [r.run_id for r in grid.runs]
    for rid, short in short_ids(ids).items():
        assert grid.find(short).run_id == rid
    with pytest.raises(GridError, match=r"prefix '135M-vanilla' is ambiguous in mode 'local': 3 runs start with it: "
                                        r"135M-vanilla-[0-9a-f]{8}, 135M-vanilla-reduced2-"):
        grid.find("135M-vanilla")
    with pytest.raises(GridError, match=r"no run with id '135M-nope'"):
        grid.find("135M-nope")
    with pytest.raises(GridError, match=r"ids starting so: \['135M-recursive-cycle-nr2-[0-9a-f]{8}'\]"):
        grid.run("135M-recursive-cycle-nr2")  # the workflow's exact lookup names what was meant


def test_the_launcher_takes_a_prefix_in_run_id_and_run_dir(tmp_path):
    """``python -m mor.launch train --run-id <prefix> --run-dir runs/table10/<prefix>`` resolves
    both before the job starts (checked on the resolved arguments: no training here)."""
    from argparse import Namespace

    from mor.launch.__main__ import _full_run_id

    grid = load_grid(TABLE10, "local")
    full = next(r.run_id for r in grid.runs if r.run_id.startswith("135M-recursive-cycle-nr2"))
    a = Namespace(grid=str(TABLE10), mode="local", run_id="135M-recursive-cycle-nr2",
                  run_dir=str(tmp_path / "runs" / "table10" / "135M-recursive-cycle-nr2"))
    _full_run_id(a)
    assert a.run_id == full and a.run_dir == str(tmp_path / "runs" / "table10" / full)
    proc = subprocess.run([sys.executable, "-m", "mor.launch", "train", "--grid", str(TABLE10), "--run-id",
                           "135M-vanilla", "--run-dir", str(tmp_path / "x")], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert proc.returncode == 2 and "is ambiguous" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def _finished_run(run_dir):
    run = tiny_run()
    from mor.model.transformer import build_model

    (run_dir / "final").mkdir(parents=True)
    model = build_model(run.model, model_shape(run.model), VOCAB)
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(run_dir / "final" / "model.safetensors"))
    (run_dir / "config.json").write_text(json.dumps({"run_id": run.run_id, "git_commit": "abc", "vocab_size": VOCAB,
                                                     "config": run.to_dict()}))
    (run_dir / "train_summary.json").write_text(json.dumps({"steps": 0, "tokens_seen": 0, "final_loss": 0.0}))
    return run_dir


def test_export_paths_say_what_they_found(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"  # one home per run (mor.layout): runs/<run id>
    _finished_run(runs / "135M-vanilla-764b48f1")
    _finished_run(runs / "135M-vanilla-reduced2-1234abcd")
    _finished_run(tmp_path / "old" / "runs" / "table10" / "135M-vanilla-764b48f1")  # the layout before
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        ("runs", r"runs: a folder holding 2 run\(s\), not a run; export one of them, "
                 r"e\.g\. runs/135M-vanilla-764b48f1"),
        ("old/runs", r"old/runs: a folder of grids \(table10\), not a run: .*python -m mor migrate-runs"),
        ("notes.txt", r"notes\.txt: a file, not a run folder"),
        ("empty", r"empty: no run here \(no config\.json"),
        ("runs/135M-vanilla", r"prefix '135M-vanilla' is ambiguous: 2 run folders start with it: "
                              r"runs/135M-vanilla-764b48f1, runs/135M-vanilla-reduced2"),
        ("runs/360M", r"runs/360M: no such run folder, and no run in runs starts with '360M'"),
        ("runs/table99/x", r"runs/table99/x: no such run folder \(runs/table99 does not exist\)"),
    ]
    for arg, pattern in cases:
        assert main(["export-hf", arg, str(tmp_path / "out")]) == 2, arg
        import re

        line = _error(capsys)
        assert re.search(pattern, line), (arg, line)
        assert "unfinished" not in line and not (tmp_path / "out").exists()
    from mor.cli import _run_folder
    from pathlib import Path

    assert _run_folder(Path("runs/135M-vanilla-7")) == Path("runs/135M-vanilla-764b48f1")
    assert _run_folder(Path("135M-vanilla-r")) == Path("runs/135M-vanilla-reduced2-1234abcd")  # a bare id


def test_export_refuses_a_folder_it_did_not_write_even_forced_and_writes_with_the_umask(tmp_path, capsys, data_root):
    run_dir = _finished_run(tmp_path / "runs" / "test" / "run")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "mine.txt").write_text("a co-author's notes")
    for force in ([], ["--force"]):
        assert main(["export-hf", str(run_dir), str(mine), "--data-root", str(data_root), *force]) == 2
        assert f"{mine}: not empty (mine.txt) and not an earlier export" in _error(capsys)
        assert (mine / "mine.txt").read_text() == "a co-author's notes"
    out = tmp_path / "hf"
    args = ["export-hf", str(run_dir), str(out), "--data-root", str(data_root)]
    old = os.umask(0o022)
    try:
        assert main(args) == 0
    finally:
        os.umask(old)
    assert (out / "model.safetensors").exists()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
    assert main(args) == 2  # a finished export is not overwritten silently either
    assert "an earlier export; pass --force to replace it" in _error(capsys)


def test_status_takes_a_run_by_any_unique_prefix_and_shows_an_id_that_pastes(tmp_path):
    from rich.console import Console

    from mor.status import collect, render
    from mor.status.read import Paths
    from mor.status.targets import resolve_targets

    grids_dir = REPO / "grids"
    paths = Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "logs" / "slurm")
    ids = [r.run_id for r in load_grid(TABLE10, "local").runs]
    vanilla = next(i for i in ids if i.startswith("135M-vanilla-") and "reduced" not in i)
    for target in (f"runs/table10/{vanilla[:-3]}", f"table10/{vanilla}"):
        grid, = resolve_targets([target], grids_dir, "local")
        assert [r.run_id for r in grid.runs] == [vanilla], target
        console = Console(record=True, width=80)
        console.print(render(collect([grid], paths), width=80))
        shown = console.export_text().splitlines()[2].split()[0]
        assert vanilla.startswith(shown) and [i for i in ids if i.startswith(shown)] == [vanilla], shown
        assert load_grid(TABLE10, "local").find(shown).run_id == vanilla  # what was shown pastes back
    with pytest.raises(GridError, match=r"prefix '135M-vanilla' is ambiguous in mode 'local': runs of \[.*'table10'"):
        resolve_targets(["135M-vanilla"], grids_dir, "local")  # the same vanilla run is in other grids too
    grid, = resolve_targets(["360M-recursive-middlesequence-nr3"], grids_dir, "local")  # a bare id of one grid
    assert grid.name == "table10" and [r.run_id[:-9] for r in grid.runs] == ["360M-recursive-middlesequence-nr3"]
