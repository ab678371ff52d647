"""Faults users meet, each provoked for real and answered by a clear error, nothing lost.

- malformed grids that used to be accepted (an unknown artifact, a reference row with an
  unknown key) stop the workflow when the Snakefile is parsed, naming the file and the key;
- a second Snakemake started in a folder where one is running refuses, names the folder,
  and leaves the first one's locks alone; the first then finishes as if alone;
- a full disk (ENOSPC, a small tmpfs) during a checkpoint write or a parquet write raises
  the OSError and leaves the previous checkpoint / results file whole, with no temporary;
  during a train job (room for one checkpoint and a half), collection and rendering: one line
  naming the file, the last good checkpoint / outputs intact, a clean resume once space is back;
- a truncated, garbled, empty or missing file in the newest checkpoint: the resume names it
  and goes on from the previous good checkpoint, ending bit for bit as an undisturbed run;
- a SIGKILLed Snakemake: its local trainer notices, checkpoints the step in progress and
  exits; a second writer on one run waits for the first, then refuses naming it;
- a corrupt token file or corrupt final weights under the local launcher: exit 1 with an
  error that names the file.

Every wait is on an event (a file, a line, a process state); deadlines only bound a hang and
scale with the machine (tests/helpers/deadlines.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from helpers.checkpoint import reference  # noqa: F401 - the undisturbed run the damaged ones are held to
from helpers.deadlines import deadline, wait_for
from helpers.paths import REPO
from helpers.procs import frozen, members, run_group
from helpers.workflow import E2E_GRID, SNAKEMAKE

from mor.layout import run_dir as run_home, run_log
from mor.grids import SCHEMA_FILE, load_grid


def run_snakemake(workdir: Path, grids: Path, data_root: Path, *args: str, popen: bool = False, snakefile=None):
    cmd = [*SNAKEMAKE, "--snakefile", str(snakefile or REPO / "Snakefile"), "--profile", str(REPO / "local"),
           "tables/table10", "--directory", str(workdir), "--config", f"grids_dir={grids}", f"data_root={data_root}",
           *args]
    checkout = Path(snakefile or REPO / "Snakefile").parent  # the profile's config file is relative to it
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"))
    if popen:
        return subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    return run_group(cmd, cwd=checkout, env=env, timeout=deadline(900))


def e2e_grids(root: Path, text: str = E2E_GRID) -> Path:
    grids = root / "grids"
    grids.mkdir(parents=True)
    (grids / "e2e.yaml").write_text(text)
    return grids


# ------------------------------------------------------------------ malformed grids, at parse time
@pytest.mark.parametrize("edit, names", [
    (("artifacts: [tables/table10, figures/fig6]", "artifacts: [tables/table10, tables/table99]"),
     ["key artifacts.1", "'tables/table99' is not one of"]),
    (("val_nll: 3.0330}", "val_nll: 3.0330, paper_nll: 2.9}"),
     ["key reference.0", "'paper_nll' was unexpected", "allowed keys are"]),
])
def test_a_malformed_grid_is_rejected_when_the_snakefile_is_parsed(tmp_path, edit, names):
    grids = e2e_grids(tmp_path, E2E_GRID.replace(*edit))
    proc = run_snakemake(tmp_path, grids, tmp_path / "data", "-n")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{grids / 'e2e.yaml'}: " in text, text[-3000:]
    assert all(n in text for n in names), text[-3000:]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "logs").exists()


def test_the_schema_knows_every_artifact_and_every_reference_key_the_reports_read():
    from mor.reports import RENDERERS
    from mor.reports.ablation import SPECS
    from mor.reports.common import REF_KEYS

    schema = yaml.safe_load(SCHEMA_FILE.read_text())["properties"]
    assert set(schema["artifacts"]["items"]["enum"]) == set(RENDERERS)
    read = set(REF_KEYS) | {"val_nll", "max_batch"} | {m for spec in SPECS.values() for m in spec.metrics}
    assert set(schema["reference"]["items"]["properties"]) == read


# ------------------------------------------------------------------ two workflows in one folder
def _group_stopped(pgid: int) -> bool:
    """Every live member of the group is frozen (helpers.procs.frozen: stopped, or bound to stop
    before it runs user code again, as a parent in the middle of a vfork is)."""
    pids = members("pgrp", pgid)
    return bool(pids) and all(frozen(pid) for pid in pids)


def test_a_second_workflow_in_the_same_folder_refuses_and_the_first_finishes(tmp_path, data_root):
    """The first Snakemake is frozen (SIGSTOP to its group) once it holds its locks, so the
    second one certainly meets a live owner; then it is resumed and finishes."""
    grids = e2e_grids(tmp_path)
    first = run_snakemake(tmp_path, grids, data_root, popen=True)
    locks = tmp_path / ".snakemake" / "locks"
    try:
        wait_for(lambda: (locks.is_dir() and any(locks.iterdir())) or first.poll() is not None,
                 "the first workflow's locks", 300)
        assert first.poll() is None, first.communicate()[0]
        os.killpg(first.pid, signal.SIGSTOP)
        wait_for(lambda: _group_stopped(first.pid), "the first workflow to stop", 60)
        held = sorted(p.name for p in locks.iterdir())

        second = run_snakemake(tmp_path, grids, data_root)
        text = second.stdout + second.stderr
        assert second.returncode != 0
        assert "Directory cannot be locked" in text and str(tmp_path) in text, text[-3000:]
        assert "removed stale Snakemake locks" not in text  # the live owner's locks are real
        assert f"mor: another Snakemake workflow is running in {tmp_path.resolve()}; its locks are kept" in text
        assert sorted(p.name for p in locks.iterdir()) == held

        os.killpg(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=deadline(900))
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 0, out[-3000:]
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "results" / "e2e.parquet").to_pylist()
    assert sorted(r["run_id"] for r in rows) == sorted(r.run_id for r in load_grid(grids / "e2e.yaml").runs)
    again = run_snakemake(tmp_path, grids, data_root)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


# ------------------------------------------------------------------ a full disk
@contextlib.contextmanager
def tmpfs(mnt: Path, size: str):
    """A tmpfs of ``size`` at ``mnt`` (root only): writes past its size fail with ENOSPC, as on a
    full disk. Skips with the reason where mounting is impossible."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        pytest.skip("mounting a small tmpfs needs root on Linux")
    mnt.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"mor-enospc-{uuid.uuid4().hex[:6]}",
                           str(mnt)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs."""
    with tmpfs(tmp_path / "small", "1m") as mnt:
        yield mnt


def _disk_bytes(folder: Path) -> int:
    """What the files under ``folder`` take on disk (blocks, as a tmpfs counts them)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def _fill(folder: Path, leave: int) -> None:
    """Fill the file system of ``folder`` until about ``leave`` bytes are free."""
    free = shutil.disk_usage(folder).free - leave
    if free > 0:
        (folder / "ballast").write_bytes(b"\0" * free)


def _no_temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_whole(small_disk):
    import torch

    from mor.train.checkpoint import load_latest, save_checkpoint

    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    ckpt = small_disk / "checkpoints"
    save_checkpoint(ckpt, model, opt, {"step": 4, "config_hash": "c0ffee"})
    before = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}

    _fill(small_disk, leave=20_000)  # room for less than one more checkpoint (~50 KB)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(Exception) as err:  # safetensors raises its own SafetensorError, quoting the OS error
        save_checkpoint(ckpt, model, opt, {"step": 8, "config_hash": "c0ffee"})
    assert getattr(err.value, "errno", None) == errno.ENOSPC or "No space left on device" in str(err.value), err.value
    assert f"checkpoint {ckpt / 'step-000008'} could not be written" in str(err.value)  # names the file

    (small_disk / "ballast").unlink()
    after = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    assert after == before  # the step-4 checkpoint and latest.json, byte for byte
    assert _no_temporaries(small_disk) == []
    state = json.loads((ckpt / "step-000004" / "state.json").read_text())
    path, loaded, _, _ = load_latest(ckpt, state["config_hash"])  # intact: sizes and digests check out
    assert path.name == "step-000004" and loaded["step"] == 4


def test_a_full_disk_during_a_parquet_write_keeps_the_previous_results(small_disk):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mor.atomic import atomic_path

    target = small_disk / "results.parquet"
    old = pa.table({"run_id": ["a", "b"], "val_nll": [3.1, 3.2]})
    with atomic_path(target) as tmp:
        pq.write_table(old, tmp)
    before = target.read_bytes()

    _fill(small_disk, leave=20_000)
    big = pa.table({"run_id": [f"r{i}" for i in range(50_000)], "val_nll": [float(i) for i in range(50_000)]})
    with pytest.raises(OSError) as err:
        with atomic_path(target) as tmp:
            pq.write_table(big, tmp, compression="none")
    assert err.value.errno == errno.ENOSPC, err.value
    assert f"No space left on device while writing {target}; the previous results.parquet" in str(err.value)
    assert target.read_bytes() == before and pq.read_table(target).equals(old)
    assert _no_temporaries(small_disk) == []


def test_a_full_disk_during_training_fails_clearly_keeps_the_last_checkpoint_and_resumes(tmp_path, data_root):
    """A run whose folder is on a disk with room for one checkpoint and a half: the first
    checkpoint (step 2) fits, the second cannot (the old one stays until the new one is whole),
    so training stops with a one-line error naming the checkpoint and the disk; step 2's
    checkpoint is intact and no temporary is left. With the space back, the same command
    resumes at step 2 and ends with the weights and losses of an undisturbed run."""
    from safetensors.torch import load_file
    from helpers.slurm_jobs import write_grid

    from mor.train.checkpoint import load_latest

    grid = write_grid(tmp_path / "grids", "disk", steps=8, tying=False, checkpoint_every=2)
    run_id = load_grid(grid, "local").runs[0].run_id
    (tmp_path / "ref").mkdir()
    ref = _launch("train", grid, run_id, tmp_path / "ref", data_root)  # the undisturbed run, on a normal disk
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_dir = tmp_path / "ref" / "runs" / "disk" / run_id
    one = _disk_bytes(ref_dir / "checkpoints" / "step-000008")
    with tmpfs(tmp_path / "disk", "64m") as mnt:
        (mnt / "runs" / "disk").mkdir(parents=True)
        _fill(mnt, leave=int(1.5 * one) + 256 * 1024)  # + the config, logs and pointer files
        full = _launch("train", grid, run_id, mnt, data_root)
        run_dir = mnt / "runs" / "disk" / run_id
        assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
        errors = [ln for ln in full.stderr.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and "No space left on device" in errors[0], full.stderr[-3000:]
        assert f"checkpoint {run_dir / 'checkpoints' / 'step-000004'} could not be written" in errors[0]
        assert "the previous checkpoint" in errors[0] and "resumes from it once there is room" in errors[0]
        config_hash = json.loads((run_dir / "checkpoints" / "step-000002" / "state.json").read_text())["config_hash"]
        path, state, _, _ = load_latest(run_dir / "checkpoints", config_hash)  # sizes and digests check out
        assert path.name == "step-000002" and state["step"] == 2
        assert _no_temporaries(mnt) == [] and not (run_dir / "final").exists()

        (mnt / "ballast").unlink()  # space is back
        again = _launch("train", grid, run_id, mnt, data_root)
        assert again.returncode == 0, again.stderr[-3000:]
        summary = json.loads((run_dir / "train_summary.json").read_text())
        assert summary["resumed_from"] == 2
        got, want = (load_file(str(d / "final" / "model.safetensors")) for d in (run_dir, ref_dir))
        assert got.keys() == want.keys() and all(torch_equal(got[k], want[k]) for k in want)
        keep = ("step", "loss", "grad_norm")
        rows = lambda d: [{k: json.loads(ln)[k] for k in keep} for ln in (d / "train_log.jsonl").read_text().splitlines()]  # noqa: E731
        assert rows(run_dir) == rows(ref_dir)  # each step once, the same losses


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_a_full_disk_during_collection_and_rendering_keeps_the_previous_outputs(tmp_path, capsys, monkeypatch):
    """``mor collect`` and ``mor report`` writing to a full disk (result rows as an eval job
    writes them, numbers made up): exit 2, one line naming the file and what to do; the
    previous grid table and the previous rendered table are whole, no temporary is left;
    with the space back the same commands write them again."""
    from helpers.tiny import _row

    from mor.cli import main
    from mor.grids import load_grid
    from mor.results import write_rows

    grid = tmp_path / "table10.yaml"  # three runs (mor report draws exactly the runs its grid lists)
    grid.write_text("name: table10\ndefaults: {model.scale: 135M}\nruns:\n"
                    "  - {name: vanilla, set: {model.variant: vanilla}}\n"
                    "  - {name: reduced, set: {model.variant: vanilla, model.reduced: true, model.num_recursions: 2}}\n"
                    "  - {name: cycle, set: {model.variant: recursive, model.tying: cycle, model.num_recursions: 2}}\n"
                    "modes:\n  local: {scale_map: {135M: small}}\n"
                    "reference:\n  - {paper_scale: 135M, variant: recursive, tying: cycle, num_recursions: 2, val_nll: 3.0071}\n")
    runs = [r.config for r in load_grid(grid, "local").runs]
    rows = [tmp_path / "rows" / f"{i}.parquet" for i in range(len(runs))]
    for path, run, nll in zip(rows, runs, (5.0, 5.4, 5.2)):
        write_rows(path, [_row(run, val_nll=nll)])
    with tmpfs(tmp_path / "disk", "4m") as mnt:
        monkeypatch.chdir(mnt)
        table, artifact = mnt / "table10.parquet", mnt / "tables" / "table10"
        collect = ["collect", "--grid", "table10", "--out", str(table), *map(str, rows)]
        report = ["report", "--artifact", "tables/table10", "--results", str(table), "--grid", str(grid)]
        assert main(collect) == 0 and main(report) == 0
        capsys.readouterr()
        before = {p: p.read_bytes() for p in [table, *artifact.rglob("*")] if p.is_file()}
        assert len(before) >= 3  # the grid table, the table's csv and html
        _fill(mnt, leave=0)
        for argv, named in ((collect, f"while writing {table}"), (report, "while writing tables/table10")):
            assert main(argv) == 2, argv[0]
            lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: No space left on device " + named), lines
            assert "is unchanged: free space and run again" in lines[0]
        after = {p: p.read_bytes() for p in [table, *artifact.rglob("*")] if p.is_file()}
        assert after == before and _no_temporaries(mnt) == []
        (mnt / "ballast").unlink()
        assert main(collect) == 0 and main(report) == 0


# ------------------------------------------------------------------ a damaged latest checkpoint
def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # a copy or a disk that stopped half-way


@pytest.mark.parametrize("damage, file, said", [
    (_truncate, "model.safetensors", "is truncated or overwritten"),
    (lambda f: f.write_text('{"step": 8, "fi'), "state.json", "is missing, corrupt or from an older format"),
    (lambda f: f.write_bytes(b""), "optimizer.safetensors", "is truncated or overwritten"),
    (lambda f: f.unlink(), "model.safetensors", "is missing"),
], ids=["truncated-weights", "garbled-state", "empty-moments", "missing-weights"])
def test_a_damaged_latest_checkpoint_resumes_from_the_previous_good_one(reference, data_root, tmp_path, capsys,
                                                                          damage, file, said):
    """A run killed after step 8 (checkpoints at 4 and 8) whose newest checkpoint is then
    damaged: the resume names the bad file, takes step 4's, and ends bit for bit where an
    undisturbed run ends; never a half-read state."""
    from helpers.checkpoint import _assert_same_run, _partial, _trainer

    run, ref = reference
    d = tmp_path / "run"
    _partial(run, d, data_root, 8)
    bad = d / "checkpoints" / "step-000008" / file
    damage(bad)
    assert _trainer(run, d, data_root).fit()["resumed_from"] == 4
    assert f"skipping checkpoint {bad.parent}: {bad} {said}" in capsys.readouterr().err
    _assert_same_run(ref, d)


# ------------------------------------------------------------------ corrupt inputs under the local launcher
def _launch(kind: str, grid: Path, run_id: str, workdir: Path, data_root: Path, *extra: str
            ) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mor.launch", kind, "--grid", str(grid), "--run-id", run_id, "--mode", "local",
           "--run-dir", f"runs/{grid.stem}/{run_id}", "--data-root", str(data_root), "--launcher", "local", *extra]
    return run_group(cmd, cwd=workdir, env=dict(os.environ, PYTHONPATH=str(REPO / "src")), timeout=deadline(600))


def _one_run_grid(tmp_path: Path) -> tuple[Path, str]:
    from helpers.slurm_jobs import write_grid

    grid = write_grid(tmp_path / "grids", "bad", steps=4, tying=False)
    return grid, load_grid(grid, "local").runs[0].run_id


def _data_with(tmp_path: Path, data_root: Path, corrupt: str) -> Path:
    """A data root like ``data_root`` whose file ``corrupt`` (relative) holds garbage."""
    bad = tmp_path / "bad-data"
    for d in ("corpus", "tokenizer", "tokens"):
        (bad / d).mkdir(parents=True)
        for f in (data_root / d).iterdir():
            (bad / d / f.name).symlink_to(f)
    (bad / corrupt).unlink()
    (bad / corrupt).write_bytes(b"not a numpy file")
    return bad


def test_a_corrupt_token_file_fails_the_train_job_naming_the_file(tmp_path, data_root):
    grid, run_id = _one_run_grid(tmp_path)
    bad = _data_with(tmp_path, data_root, "tokens/train-bpe-4096.npy")
    proc = _launch("train", grid, run_id, tmp_path, bad)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert str(bad / "tokens" / "train-bpe-4096.npy") in text, text[-3000:]
    assert not (tmp_path / "runs" / "bad" / run_id / "final").exists()  # nothing claims to be trained


def test_corrupt_final_weights_fail_the_eval_job_naming_the_file(tmp_path, data_root):
    grid, run_id = _one_run_grid(tmp_path)
    trained = _launch("train", grid, run_id, tmp_path, data_root)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    weights = tmp_path / "runs" / "bad" / run_id / "final" / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])  # torn, as by a copy that stopped half-way
    out = tmp_path / "results" / "runs" / "bad" / f"{run_id}.parquet"
    proc = _launch("eval", grid, run_id, tmp_path, data_root, "--out", str(out))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert str(weights) in text, text[-3000:]
    assert not out.exists()  # no row scored from broken weights
    summary = json.loads((weights.parent.parent / "train_summary.json").read_text())
    assert summary["steps"] == 4  # the training record is untouched


# ------------------------------------------------------------------ a checkout under an awkward path
def test_a_checkout_under_a_path_with_a_space_and_non_ascii_characters_runs_end_to_end(tmp_path, data_root):
    """Checkout, interpreter (a venv reached through such a path), grids, data and working
    folder all under 'mor checkout ü/...': every path a rule puts in a shell command is quoted."""
    root = tmp_path / "mor checkout ü"
    checkout = root / "repo ä"
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for rel in listed:
        if rel.split("/")[0] in ("tests", "benchmarks") or not (REPO / rel).is_file():
            continue
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, checkout / rel)
    venv = root / "venv é"
    venv.symlink_to(Path(sys.prefix))  # the same environment, its interpreter at a path with a space
    data = root / "data ø"
    data.symlink_to(data_root)
    grids = e2e_grids(root / "grids ß")
    work = root / "work dir"
    work.mkdir()
    cmd = [str(venv / "bin" / "python"), "-m", "snakemake", "--snakefile", str(checkout / "Snakefile"),
           "--profile", str(checkout / "local"), "tables/table10", "figures/fig6", "--directory", str(work),
           "--config", f"grids_dir={grids}", f"data_root={data}"]
    proc = run_group(cmd, cwd=checkout, env=dict(os.environ, PYTHONPATH=str(checkout / "src")), timeout=deadline(900))
    logs = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted((work / "logs").rglob("*.log"))
                     ) if (work / "logs").exists() else ""
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:] + logs
    import pyarrow.parquet as pq

    rows = pq.read_table(work / "results" / "e2e.parquet").to_pylist()
    assert sorted(r["run_id"] for r in rows) == sorted(r.run_id for r in load_grid(grids / "e2e.yaml").runs)
    assert all(r["train_steps"] == 16 for r in rows)
    md = (work / "tables" / "table10" / "table10.md").read_text()
    assert all(r["run_id"] in md for r in rows)
    assert (work / "figures" / "fig6" / "fig6.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "mor").exists()  # no path split at its space


# ------------------------------------------------------------------ asked-for components fail, never skip
def _inner_pytest(tmp_path: Path, test_file: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    counts = tmp_path / "counts.json"
    env = {**env, "MOR_TEST_COUNTS": str(counts), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")])}
    env.pop("MOR_SUITE_ID", None)
    return subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests" / test_file), "-q", "-rfEs",
                           "-m", "slow or not slow", "-p", "no:cacheprovider", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=deadline(300))


def test_asked_for_slurm_tests_fail_with_the_reason_when_the_cluster_cannot_start(tmp_path):
    """MOR_TESTS=slurm and up.sh failing (here: packages not installable): every Slurm test
    fails naming the cause; none is skipped, so the run cannot be green without them."""
    up = tmp_path / "up.sh"
    up.write_text("echo '[testcluster] apt-get install failed (rc=100)' >&2\nexit 3\n")
    (tmp_path / "broken_up.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\nfrom helpers import slurm_cluster\n"
        f"from pathlib import Path\nslurm_cluster.UP_SH = Path({str(up)!r})\n")
    env = dict(os.environ, MOR_TESTS="slurm", MOR_SLURM_STATE=str(tmp_path / "state"))
    proc = _inner_pytest(tmp_path, "cluster/test_slurm_cluster.py", env, "-p", "broken_up")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "2 failed" in out or "1 failed, 1 error" in out or "2 errors" in out, out[-3000:]
    assert "skipped" not in out.splitlines()[-1], out[-3000:]
    assert "MOR_TESTS asks for the Slurm tests, but" in out and "apt-get install failed (rc=100)" in out
    counts = json.loads((tmp_path / "counts.json").read_text())
    assert counts["slurm"] == {"failed": 2}, counts


def test_asked_for_browser_test_fails_with_the_reason_when_chromium_cannot_be_had(tmp_path, data_root):
    """MOR_TESTS=browser, no chromium on PATH and apt-get failing: the browser test fails
    naming why, it does not skip."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"
    apt.write_text("#!/bin/sh\necho 'E: Unable to locate package chromium' >&2\nexit 100\n")
    apt.chmod(0o755)
    env = dict(os.environ, MOR_TESTS="browser", PATH=str(bin_dir))
    proc = _inner_pytest(tmp_path, "cluster/test_report_browser.py", env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "1 failed" in out.splitlines()[-1] and "skipped" not in out.splitlines()[-1], out[-3000:]
    assert "MOR_TESTS asks for the browser tests, but Chromium cannot be had" in out
    assert "Unable to locate package chromium" in out
    assert json.loads((tmp_path / "counts.json").read_text())["browser"] == {"failed": 1}


def test_lock_files_are_stale_only_when_no_workflow_holds_the_folder(tmp_path):
    """workflow_guard in both branches, without Snakemake: a live holder of the workflow flock
    (another process that parsed the Snakefile) keeps the lock files; once it is gone, the
    next workflow removes them."""
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("x")
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from mor.workflow_guard import clear_stale_locks; "
                               "clear_stale_locks(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    try:
        assert holder.stdout.readline().startswith("mor: removed stale Snakemake locks in ")  # nobody held them
        assert holder.stdout.readline().strip() == "held" and not locks.exists()
        locks.mkdir()
        (locks / "0.input.lock").write_text("x")  # its own lock, as Snakemake would write
        again = run_group([sys.executable, "-c", "import sys; from mor.workflow_guard import clear_stale_locks; "
                           "print(clear_stale_locks(sys.argv[1]))", str(tmp_path)],
                          env=dict(os.environ, PYTHONPATH=str(REPO / "src")), timeout=deadline(60))
        assert again.stdout.strip() == "False" and (locks / "0.input.lock").exists()
        assert "another Snakemake workflow is running" in again.stderr
    finally:
        holder.communicate(input="", timeout=deadline(60))
    gone = run_group([sys.executable, "-c", "import sys; from mor.workflow_guard import clear_stale_locks; "
                      "print(clear_stale_locks(sys.argv[1]))", str(tmp_path)],
                     env=dict(os.environ, PYTHONPATH=str(REPO / "src")), timeout=deadline(60))
    assert gone.stdout.strip().endswith("True") and not (locks / "0.input.lock").exists()


# ------------------------------------------------------------------ a SIGKILLed workflow, two writers
def _state(pid: int) -> str | None:
    from helpers.procs import stat

    s = stat(pid)
    return None if s is None else str(s["state"])


def _lease_holder(lease: Path) -> int | None:
    """The pid written in a run's writer lock (None before a train job took it)."""
    try:
        text = lease.read_text()
    except OSError:
        return None
    return int(text.split()[1]) if text.startswith("pid ") else None


def _lease_free(lease: Path) -> bool:
    import fcntl

    fd = os.open(lease, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_sigkilled_workflow_leaves_no_trainer_behind_and_loses_no_step(tmp_path, data_root):
    """Snakemake runs a long local train job; once the trainer logs a step it is frozen
    (SIGSTOP, so it is certainly mid-run whatever the machine's speed), Snakemake is SIGKILLed
    (it cannot kill its jobs), and the trainer is let go. It notices its workflow is gone,
    stops at the end of its step with a checkpoint of that step, logs why and exits; its run's
    writer lock is free for the next run, which resumes from that checkpoint."""
    from helpers.slurm_jobs import write_grid

    grids = tmp_path / "grids"
    grid = write_grid(grids, "orphan", steps=20_000, tying=False, checkpoint_every=10_000)
    run_id = load_grid(grid, "local").runs[0].run_id
    run_dir = run_home(tmp_path / "runs", run_id)  # the run's one home (mor.layout, issue 58)
    lease = run_dir.parent / f".{run_id}.writer.lock"
    cmd = [*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "local"), "tables/table10",
           "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}"]
    flow = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    trainer = None
    try:
        log = run_dir / "train_log.jsonl"
        wait_for(lambda: (log.exists() and log.read_text().count("\n") >= 1) or flow.poll() is not None,
                 "first logged step", 600)
        assert flow.poll() is None, "the workflow ended before its trainer logged a step"
        trainer = _lease_holder(lease)
        assert trainer and _state(trainer) not in (None, "Z")
        os.kill(trainer, signal.SIGSTOP)
        wait_for(lambda: frozen(trainer), "the trainer to freeze", 60)
        os.kill(flow.pid, signal.SIGKILL)
        flow.wait()
        os.kill(trainer, signal.SIGCONT)
        wait_for(lambda: _state(trainer) in (None, "Z"), "the orphaned trainer to stop", 300)
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
            flow.wait()
        if trainer and _state(trainer) not in (None, "Z"):
            os.kill(trainer, signal.SIGKILL)
    text = run_log(tmp_path / "logs", "orphan", run_id, "train").read_text()
    assert f"the workflow that started this job (Snakemake, pid {flow.pid}) is gone" in text, text[-2000:]
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    last = steps[-1]
    assert last < 20_000 and f"stopped by SIGTERM after step {last}" in text, text[-2000:]
    ckpt = json.loads((run_dir / "checkpoints" / "latest.json").read_text())["path"]
    assert ckpt == f"step-{last:06d}"  # every step trained is in the checkpoint: nothing lost
    assert not (run_dir / "train_summary.json").exists() and _lease_free(lease)


def _train_cmd(grid: Path, run_id: str, data_root: Path) -> list[str]:
    return [sys.executable, "-m", "mor.launch", "train", "--grid", str(grid), "--run-id", run_id, "--mode", "local",
            "--run-dir", f"runs/{grid.stem}/{run_id}", "--data-root", str(data_root), "--launcher", "local"]


def test_a_second_writer_on_one_run_waits_for_the_first_and_then_refuses(tmp_path, data_root):
    """While one process holds a run's writer lock, a train job for the same run waits for it
    and, at its (here zero) wait limit, refuses naming the holder and writing nothing; once the
    holder is gone a waiting job takes the lock and trains."""
    grid, run_id = _one_run_grid(tmp_path)
    run_dir = tmp_path / "runs" / grid.stem / run_id
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from mor.launch.lease import run_lease\nwith run_lease(Path(sys.argv[1])):\n"
                               "    print('held', flush=True); sys.stdin.read()", str(run_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = run_group(_train_cmd(grid, run_id, data_root), cwd=tmp_path, env=dict(env, MOR_LEASE_WAIT_S="0"),
                            timeout=deadline(120))
        assert refused.returncode == 2, refused.stderr[-2000:]
        err = [ln for ln in refused.stderr.splitlines() if ln.startswith("error: ")]
        assert len(err) == 1 and f"{Path('runs') / grid.stem / run_id}: another writer holds this run (pid {holder.pid} on " \
            in err[0], refused.stderr[-2000:]
        assert not (run_dir / "train_log.jsonl").exists() and not (run_dir / "checkpoints").exists()
        waiting = subprocess.Popen(_train_cmd(grid, run_id, data_root), cwd=tmp_path, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            assert waiting.stderr.readline().startswith(f"mor: waiting up to 300s for the writer of runs/{grid.stem}/")
            holder.communicate(input="", timeout=deadline(60))  # the first writer ends: the lock drops
            out, _ = waiting.communicate(timeout=deadline(600))
        finally:
            if waiting.poll() is None:
                os.killpg(waiting.pid, signal.SIGKILL)
                waiting.wait()
        assert waiting.returncode == 0 and (run_dir / "train_summary.json").exists(), out[-2000:]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_job_started_by_hand_is_not_tied_to_a_workflow(monkeypatch):
    """$MOR_WORKFLOW_PID that is no ancestor (a leaked variable, a pid reused) is ignored: the
    job is not stopped; one that is an ancestor is watched, and its end is noticed."""
    from mor.launch import lease

    monkeypatch.setenv(lease.WORKFLOW_PID_ENV, str(os.getpid()))  # this process is no ancestor of itself
    assert lease.workflow_pid() is None and lease.watch_workflow(on_gone=lambda pid: pytest.fail("stopped")) is None
    monkeypatch.setenv(lease.WORKFLOW_PID_ENV, str(os.getppid()))
    assert lease.workflow_pid() == os.getppid()
