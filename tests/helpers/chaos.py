"""Chaos test: kill -9 the whole workflow again and again, restart it, and compare.

A 3-run grid (tiny scale, a checkpoint every few steps, one lm-eval task) is run twice through the real
``snakemake --profile local``: once undisturbed, once under fire. Under fire, each attempt
starts Snakemake in its own process group, waits for a phase of the workflow (a train,
lmeval, eval, collect or report job, found by its command line; or a random moment), and sends
SIGKILL to the whole group; then the same command starts again, with nothing done by hand
in between. Finally both merged parquets must be identical (every column but wall-clock
times and the write timestamp), and so must the tables.

Counted and printed: kills per phase, restarts that failed by themselves (they would need a
person: a stale lock, an incomplete-file error, a corrupt file; must be 0), and corrupt or
half-written files found by reading back everything the workflow wrote (must be 0).

    .venv/bin/python tests/helpers/chaos.py --kills 12 --seed 1       # by hand
    (CI runs it through tests/workflow/test_chaos.py)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script (python tests/helpers/chaos.py): the helpers package is one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import procs  # noqa: E402
from helpers.paths import REPO  # noqa: E402
from helpers.workflow import E2E_GRID  # noqa: E402


# test_workflow's two-run grid with a third run, longer training and frequent checkpoints
CHAOS_GRID = (E2E_GRID.replace("name: e2e", "name: chaos").replace("[middle_cycle]", "[middle_cycle, cycle]")
              .replace("tokens: 8192", "tokens: 61440").replace("checkpoint_every: 8", "checkpoint_every: 6")
              .replace("nll_tokens: 2048", "nll_tokens: 4096")
              .replace("batch: 8}\nreference", "batch: 8, lm_eval_tasks: [mor_piqa], lm_eval_limits: {mor_piqa: 20}}"
                                               "\nreference"))
TARGETS = ("tables/table10", "figures/fig6")
PHASES = {"mor.launch train": "train", "mor.launch lmeval": "lmeval", "mor.launch eval": "eval",
          "mor collect": "collect", "mor report": "report"}  # in pipeline order
# columns that measure the machine, not the result
WALL_CLOCK = {"train_time_s", "train_tokens_per_s", "model_flops_per_s", "mfu", "created_at"}  # timings: never equal
# provenance: the checkout's commit when a job ran; a commit made in a shared working tree
# while the test runs changes it (and the table note that cites it), not the results
PROVENANCE = {"git_commit"}
_COMMITS = re.compile(r"commit\(s\) [0-9a-f, ]+")


@dataclass
class ChaosReport:
    kills: Counter = field(default_factory=Counter)  # phase -> kills
    restarts: int = 0
    manual: list[str] = field(default_factory=list)  # restarts that failed by themselves
    corrupt: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    undisturbed_s: float = 0.0
    chaos_s: float = 0.0

    def summary(self) -> str:
        per_phase = ", ".join(f"{k} {v}" for k, v in sorted(self.kills.items()))
        return (f"chaos: {sum(self.kills.values())} kills ({per_phase}); {self.restarts} restarts; "
                f"restarts that needed anything manual: {len(self.manual)}; corrupt files found: {len(self.corrupt)}; "
                f"result mismatches: {len(self.mismatches)}; undisturbed {self.undisturbed_s:.0f} s, "
                f"under fire {self.chaos_s:.0f} s")


def _command(workdir: Path, grids: Path, data_root: Path) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "local"),
            *TARGETS, "--directory", str(workdir), "--config", f"grids_dir={grids}", f"data_root={data_root}"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO / "src"))


def _setup(workdir: Path) -> Path:
    grids = workdir / "grids"
    grids.mkdir(parents=True)
    (grids / "chaos.yaml").write_text(CHAOS_GRID)
    return grids


def _phase_of(sid: int) -> str | None:
    """The phase of a job running in process group/session ``sid`` (None between jobs)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getsid(int(pid)) != sid:
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ProcessLookupError):
            continue
        for needle, phase in PHASES.items():
            if needle in cmd:
                return phase
    return None


def _wait_gone(sid: int, timeout: float = 60.0) -> None:
    """Until no process of session ``sid`` is left: SIGKILL to any that left the process
    group; raises if one survives ``timeout`` (a deadline against a hang)."""
    deadline = time.monotonic() + timeout
    while members := procs.members("session", sid, reap=True):
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {members} of the killed workflow (session {sid}) survive SIGKILL")
        time.sleep(0.02)


def _steps_logged(workdir: Path) -> int:
    """Training steps logged so far over every run of the workflow: a train job's progress."""
    total = 0
    for log in workdir.glob("runs/*/train_log.jsonl"):
        try:
            total += log.read_bytes().count(b"\n")
        except OSError:
            continue
    return total


def _attempt(cmd: list[str], workdir: Path, target: str | None, rng: random.Random, log) -> tuple[str, int | None]:
    """Start the workflow; kill it in phase ``target`` ('any': at a random moment; None: never).
    Returns (what happened, exit code): ('killed:<phase>', None) or ('exited', rc).

    A phased kill waits for events, not for time: the phase's job (or a later one) running,
    and for train a random number of newly logged steps, so a machine of any speed reaches
    every kill the plan asks for. Whatever happens (a failed assertion, a test timeout),
    the attempt's whole process group is killed before this returns."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=REPO, start_new_session=True)
    sid = proc.pid
    try:
        random_at = time.monotonic() + rng.uniform(0.5, 8.0)  # 'any': a moment, not a phase
        steps_needed = rng.randint(1, 12)  # train: this many new steps logged after the job shows
        steps_at_start = None
        order = list(PHASES.values())
        while proc.poll() is None:
            phase = _phase_of(sid) if target is not None else None
            due = target == "any" and time.monotonic() >= random_at
            if target not in (None, "any") and phase is not None and order.index(phase) >= order.index(target):
                if phase == "train" == target:
                    steps_at_start = _steps_logged(workdir) if steps_at_start is None else steps_at_start
                    due = _steps_logged(workdir) - steps_at_start >= steps_needed
                else:
                    due = True  # the phase's job runs (or a later one's, if a short job was missed)
            if due:
                phase_now = _phase_of(sid) or "between jobs"
                os.killpg(sid, signal.SIGKILL)
                proc.wait()
                _wait_gone(sid)
                return f"killed:{phase_now}", None
            time.sleep(0.01)
        return "exited", proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.wait()
        _wait_gone(sid)


def _read_back(workdir: Path) -> list[str]:
    """Every file the workflow wrote, read in full; returns those that are corrupt or torn."""
    import pyarrow.parquet as pq
    from safetensors.torch import load_file

    bad = []
    for p in sorted(workdir.rglob("*")):
        if ".snakemake" in p.parts or not p.is_file():
            continue
        try:
            if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name):
                bad.append(f"{p}: temporary left behind")
            elif p.suffix == ".parquet":
                pq.read_table(p)
            elif p.suffix == ".json":
                json.loads(p.read_text())
            elif p.suffix == ".jsonl":
                [json.loads(ln) for ln in p.read_text().splitlines()]
            elif p.suffix == ".safetensors":
                load_file(str(p))
            elif p.suffix == ".png":
                assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            elif p.suffix == ".pdf":
                assert p.read_bytes()[:4] == b"%PDF" and b"%%EOF" in p.read_bytes()[-64:]
        except Exception as e:  # noqa: BLE001 - every kind of unreadable counts
            bad.append(f"{p}: {type(e).__name__}: {e}")
    return bad


def _compare(ref: Path, got: Path) -> list[str]:
    import pyarrow.parquet as pq

    out = []
    a = {r["run_id"]: r for r in pq.read_table(ref / "results" / "chaos.parquet").to_pylist()}
    b = {r["run_id"]: r for r in pq.read_table(got / "results" / "chaos.parquet").to_pylist()}
    if a.keys() != b.keys():
        return [f"run ids differ: {sorted(a)} vs {sorted(b)}"]
    for rid in a:
        for col in a[rid]:
            if col not in WALL_CLOCK | PROVENANCE and a[rid][col] != b[rid][col]:
                out.append(f"{rid}.{col}: {a[rid][col]!r} != {b[rid][col]!r}")
    for f in ("table10.csv", "table10.md"):
        want, have = ((d / "tables" / "table10" / f).read_text() for d in (ref, got))
        if _COMMITS.sub("commit(s) *", want) != _COMMITS.sub("commit(s) *", have):
            out.append(f"tables/table10/{f} differs")
    return out


def run_chaos(root: Path, data_root: Path, kills: int = 12, seed: int = 0, max_attempts: int = 60) -> ChaosReport:
    rng = random.Random(seed)
    report = ChaosReport()
    ref, hot = root / "undisturbed", root / "chaos"
    t0 = time.monotonic()
    with open(root / "undisturbed.log", "w") as log:
        what, rc = _attempt(_command(ref, _setup(ref), data_root), ref, None, rng, log)
    if rc != 0:
        raise RuntimeError(f"the undisturbed workflow failed (rc {rc}); see {root / 'undisturbed.log'}")
    report.undisturbed_s = time.monotonic() - t0

    # kills spread over the phases in pipeline order, plus a few at random moments
    plan = ["any"] + ["train"] * 4 + ["any"] + ["lmeval"] * 2 + ["eval"] * 2 + ["collect"] * 2 + ["report"] * 2
    plan = (plan * (1 + kills // len(plan)))[:max(kills, len(plan))]
    cmd = _command(hot, _setup(hot), data_root)
    t0 = time.monotonic()
    attempts = 0
    with open(root / "chaos.log", "w") as log:
        while attempts < max_attempts:
            attempts += 1
            target = plan.pop(0) if plan else None
            print(f"--- attempt {attempts}: kill in {target or 'never'}", file=log, flush=True)
            what, rc = _attempt(cmd, hot, target, rng, log)
            if attempts > 1:
                report.restarts += 1
            if what.startswith("killed:"):
                report.kills[what.split(":", 1)[1]] += 1
                continue
            if rc != 0:
                report.manual.append(f"attempt {attempts} exited {rc} by itself (see {root / 'chaos.log'})")
                break
            break  # finished (after the last kill, or before reaching the phase it was to die in)
    report.chaos_s = time.monotonic() - t0
    report.corrupt = _read_back(hot)
    if not report.manual:
        report.mismatches = _compare(ref, hot)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-root", type=Path, default=REPO / "data")
    ap.add_argument("--keep", type=Path, help="work in this folder (kept) instead of a temporary one")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))  # this checkout's mor, as under pytest
    from helpers.tiny import ensure_data

    ensure_data(a.data_root)
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        report = run_chaos(root, a.data_root.absolute(), a.kills, a.seed)
    print(report.summary())
    for line in report.manual + report.corrupt + report.mismatches:
        print("  " + line)
    ok = not (report.manual or report.corrupt or report.mismatches) and sum(report.kills.values()) >= 10
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
