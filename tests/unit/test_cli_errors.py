"""``python -m mor``: every domain error is one line on stderr that names the file and says what
to do, never a traceback; an unfinished run is called unfinished, not corrupt."""

import errno
import subprocess
import sys

import pytest

from helpers.paths import REPO
from mor.cli import main
from mor.errors import one_line


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_an_unfinished_run_has_no_final_weights_it_is_not_corrupt(tmp_path, capsys):
    run = tmp_path / "runs" / "table10" / "135M-vanilla-764b48f1"
    (run / "checkpoints" / "step-000004").mkdir(parents=True)
    (run / "train_log.jsonl").write_text('{"step": 4, "loss": 7.0}\n')
    assert main(["export-hf", str(run), str(tmp_path / "out")]) == 2
    line = _one_error_line(capsys)
    assert f"{run}: unfinished run: no final weights" in line and "corrupt" not in line
    assert not (tmp_path / "out").exists()


def test_an_unreadable_result_file_is_one_line_naming_it(tmp_path, capsys):
    bad = tmp_path / "r.parquet"
    bad.write_bytes(b"PAR1 not really")
    assert main(["collect", "--grid", "table10", "--out", str(tmp_path / "all.parquet"), str(bad)]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {bad}: unreadable parquet") and "delete it and re-run" in line


def test_a_broken_grid_names_the_file(tmp_path, capsys):
    grid = tmp_path / "mine.yaml"
    grid.write_text("name: mine\nruns: [\n")
    assert main(["runs", "--grid", str(grid)]) == 2
    assert str(grid) in _one_error_line(capsys)


def test_a_nan_preset_fails_the_plan_naming_file_and_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MOR_SITE", raising=False)
    presets = tmp_path / "p.yaml"
    presets.write_text("scales: {135M: {train: {gpus_per_node: 1, gpu_memory_gib: .nan}}}")
    assert main(["plan", "--grid", str(REPO / "grids" / "table10.yaml"), "--presets", str(presets)]) == 2
    line = _one_error_line(capsys)
    assert f"{presets}: scales.135M.train.gpu_memory_gib" in line and "nan" in line


def test_a_checkpoint_error_and_a_full_disk_read_as_one_line():
    from mor.train.checkpoint import CheckpointError

    e = CheckpointError("runs/g/r/checkpoints: no intact checkpoint\n  delete runs/g/r/checkpoints to start again")
    assert one_line(e) == "error: runs/g/r/checkpoints: no intact checkpoint; delete runs/g/r/checkpoints to start again"
    full = OSError(errno.ENOSPC, "No space left on device", "results/table10.parquet")
    assert one_line(full) == ("error: results/table10.parquet: No space left on device; free space and run the same "
                              "command again (what was written before is intact)")


def test_a_closed_pipe_ends_quietly():
    """``python -m mor runs ... | head -1``: no BrokenPipeError traceback, exit 0. The reader
    closes its end first and only then lets the command print (an event, not a race)."""
    code = "import sys; sys.stdin.readline(); from mor.cli import main; sys.exit(main(['runs', '--grid', 'grids/table10.yaml']))"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader went away before a line came
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
