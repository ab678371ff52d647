"""Helper for tests that need a real Slurm cluster (not a test module).

``ensure_cluster()`` starts the single-node loopback cluster of
``slurm/testcluster/up.sh`` (idempotent: a healthy cluster is reused in well
under a second) and points this process's Slurm clients at it by setting
``SLURM_CONF``.  The ``slurm_cluster`` fixture is session-scoped and calls it.

Use from a test module::

    from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)

    pytestmark = pytest.mark.slurm

    def test_x(slurm_cluster): ...

Opt-in: as root, up.sh installs Debian packages and starts five daemons, so
these tests run only when ``MOR_TESTS`` is ``all`` or a comma-separated list
naming ``slurm`` (``MOR_TESTS=all bash scripts/test.sh``; CI sets it); else
they skip before anything is started.

Skips (never fails) when the cluster cannot be had for reasons outside the
code under test: not opted in, not root and no cluster already running, no
apt/packages, ``MOR_NO_SLURM=1`` set.  Any other failure of up.sh fails the
test, with the daemons' log tails in the message.

``stop_daemon(name)`` / ``restart_cluster()`` let fault tests take a daemon
away (e.g. slurmdbd, so sacct fails) and bring the cluster back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
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
OPT_IN_HINT = ("Slurm cluster tests are opt-in (as root they apt-get install Slurm and start daemons): "
               "run them with MOR_TESTS=all bash scripts/test.sh (or MOR_TESTS=slurm)")


def slurm_tests_enabled() -> bool:
    """MOR_TESTS is "all" or a comma-separated list that names "slurm"."""
    names = {n.strip().lower() for n in os.environ.get("MOR_TESTS", "").split(",")}
    return bool(names & {"all", "slurm"})


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
    if not slurm_tests_enabled():  # before up.sh: nothing is installed or started
        pytest.skip(OPT_IN_HINT)
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


def _pid_alive(pid: int) -> bool:
    """Running and not a zombie (PID 1 here does not reap the daemons it inherits)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_daemon(name: str, within_s: float = 30) -> None:
    """SIGTERM one daemon up.sh started (pid in <state>/run/NAME.pid) and wait until it is gone.

    Only the test cluster's own daemons, as root: a fault test must never touch a cluster
    it did not start.
    """
    if os.geteuid() != 0:
        pytest.skip(f"stopping {name} needs root and the test cluster's own daemons")
    pid_file = state_dir() / "run" / f"{name}.pid"
    pid = int(pid_file.read_text())
    comm = Path(f"/proc/{pid}/comm")
    assert comm.exists() and comm.read_text().strip() == name, f"pid {pid} in {pid_file} is not {name}"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + within_s
    while _pid_alive(pid):
        assert time.monotonic() < deadline, f"{name} (pid {pid}) still running {within_s}s after SIGTERM"
        time.sleep(0.2)


def restart_cluster() -> None:
    """up.sh again: it restarts whatever daemon is not running and waits until sacct answers."""
    proc = subprocess.run(["bash", str(UP_SH)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=UP_TIMEOUT_S, check=False)
    assert proc.returncode == 0, f"{UP_SH} failed (rc={proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"


@pytest.fixture(scope="session")
def slurm_cluster() -> Path:
    """Session fixture: a running single-node Slurm cluster (partition "debug").

    Returns the state dir (config in etc/, daemon logs in log/).
    """
    ensure_cluster()
    return state_dir()
