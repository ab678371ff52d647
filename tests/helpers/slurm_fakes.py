"""Fake Slurm clients on PATH: ``sacct``, ``squeue``, ``sbatch``, ``scancel`` and ``srun`` as
shell scripts that log their arguments and answer what a test writes for them, so the
launcher's decisions are tested without a Slurm installation (the ``fake`` fixture)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


NEW_ID = "4242"  # what the fake sbatch answers


FAKE = """#!/bin/sh
# fake {name}: logs its arguments, answers from $MOR_FAKE_SLURM/{name}.out / .err / .rc
d="$MOR_FAKE_SLURM"
echo "{name} $*" >> "$d/calls"
[ -f "$d/{name}.out" ] && cat "$d/{name}.out"
[ -f "$d/{name}.err" ] && cat "$d/{name}.err" >&2
exit "$(cat "$d/{name}.rc" 2>/dev/null || echo 0)"
"""


class FakeSlurm:
    """sacct, squeue, sbatch, scancel and srun as shell scripts in one directory put first on PATH
    (submitit only looks for ``srun`` to know it is on a cluster), so these tests need no Slurm
    installation."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir()
        for name in ("sacct", "squeue", "sbatch", "scancel", "srun"):
            exe = root / name
            exe.write_text(FAKE.format(name=name))
            exe.chmod(0o755)
        self.answer("sbatch", out=f"Submitted batch job {NEW_ID}\n")
        (root / "calls").write_text("")

    def answer(self, name: str, out: str = "", err: str = "", rc: int = 0) -> None:
        """What ``name`` prints and exits with from now on (a test may change it mid-wait)."""
        (self.root / f"{name}.out").write_text(out)
        (self.root / f"{name}.err").write_text(err)
        (self.root / f"{name}.rc").write_text(str(rc))

    def calls(self, name: str) -> list[str]:
        return [ln for ln in (self.root / "calls").read_text().splitlines() if ln.split()[0] == name]


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeSlurm:
    f = FakeSlurm(tmp_path / "bin")
    monkeypatch.setenv("MOR_FAKE_SLURM", str(f.root))
    monkeypatch.setenv("PATH", f"{f.root}{os.pathsep}{os.environ['PATH']}")
    return f
