"""Helper for tests that need a real Slurm cluster (not a test module).

``ensure_cluster()`` starts the single-node loopback cluster of
``slurm/testcluster/up.sh`` (idempotent: a healthy cluster is reused in well
under a second) and points this process's Slurm clients at it by setting
``SLURM_CONF``.  The ``slurm_cluster`` fixture is session-scoped and calls it.

Use from a test module::

    from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)

    pytestmark = pytest.mark.slurm

    def test_x(slurm_cluster): ...

Skips (never fails) when the cluster cannot be had for reasons outside the
code under test: not root and no cluster already running, no apt/packages,
``MOR_NO_SLURM=1`` set.  Any other failure of up.sh fails the test, with the
daemons' log tails in the message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UP_SH = REPO / "slurm" / "testcluster" / "up.sh"
DOWN_SH = REPO / "slurm" / "testcluster" / "down.sh"
# exit codes of up.sh
_RC_NOT_ROOT = 2
_RC_NO_PACKAGES = 3
# generous: a cold start may apt-get install ~100 MB of packages
UP_TIMEOUT_S = float(os.environ.get("MOR_SLURM_UP_TIMEOUT", "900"))

_ready = False


def state_dir() -> Path:
    return Path(os.environ.get("MOR_SLURM_STATE", "/tmp/mor-slurm"))


def _use_cluster_env() -> None:
    conf = state_dir() / "etc" / "slurm.conf"
    if conf.exists():
        os.environ["SLURM_CONF"] = str(conf)


def _cluster_answers() -> bool:
    """True if sinfo and sacct already talk to a cluster (any user)."""
    if not (shutil.which("sinfo") and shutil.which("sacct")):
        return False
    try:
        subprocess.run(["sinfo", "-h"], check=True, capture_output=True, timeout=20)
        subprocess.run(["sacct", "-n", "-X", "-S", "now-1minutes"], check=True,
                       capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def ensure_cluster() -> None:
    """Make sure the loopback Slurm test cluster is up, or skip the caller."""
    global _ready
    if _ready:
        return
    if os.environ.get("MOR_NO_SLURM") == "1":
        pytest.skip("MOR_NO_SLURM=1: Slurm cluster tests disabled")
    if not sys.platform.startswith("linux"):
        pytest.skip("the Slurm test cluster needs Linux")
    if os.geteuid() != 0:
        _use_cluster_env()
        if _cluster_answers():
            _ready = True
            return
        pytest.skip("the Slurm test cluster needs root to start "
                    "(run `sudo slurm/testcluster/up.sh` first)")
    try:
        proc = subprocess.run(["bash", str(UP_SH)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=UP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or b""
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
        pytest.fail(f"{UP_SH} timed out after {UP_TIMEOUT_S:.0f}s:\n{err[-6000:]}")
    out = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode == _RC_NO_PACKAGES:
        pytest.skip(f"Slurm/munge/mariadb packages unavailable:\n{out}")
    if proc.returncode == _RC_NOT_ROOT:
        pytest.skip(f"up.sh refused to run (not root):\n{out}")
    if proc.returncode != 0:
        pytest.fail(f"{UP_SH} failed (rc={proc.returncode}):\n{out}")
    _use_cluster_env()
    _ready = True


@pytest.fixture(scope="session")
def slurm_cluster() -> Path:
    """Session fixture: a running single-node Slurm cluster (partition "debug").

    Returns the state dir (config in etc/, daemon logs in log/).
    """
    ensure_cluster()
    return state_dir()
