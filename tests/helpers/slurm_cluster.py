"""Helper for tests that need a real Slurm cluster (not a test module).

``ensure_cluster()`` starts the single-node loopback cluster of
``slurm/testcluster/up.sh`` (idempotent: a healthy cluster is reused in well
under a second) and points this process's Slurm clients at it by setting
``SLURM_CONF``. The session fixture ``slurm_cluster`` (tests/conftest.py) calls it
and, at the end of the session, ``release_cluster()`` takes back what the session
started: every Slurm job submitted during the session is cancelled, and if the
session started the daemons, ``down.sh`` stops them (ports 6817-6819 released, the
``/etc/slurm/slurm.conf`` link removed). ``MOR_KEEP_SLURM=1`` keeps the daemons
running for the next session (jobs are still cancelled).

Mark such tests ``@pytest.mark.slurm`` and take the fixture::

    pytestmark = pytest.mark.slurm

    def test_x(slurm_cluster): ...

Opt-in: as root, up.sh installs Debian packages and starts five daemons, so these
tests run only when ``MOR_TESTS`` is ``all`` or a comma-separated list naming
``slurm`` (``MOR_TESTS=all bash scripts/test.sh``; CI sets it); else they skip
before anything is started. Once asked for, they never skip: a cluster that cannot
be had (not root and none running, packages not installable, up.sh failing) fails
every Slurm test with the reason, so a run asked to cover Slurm is never green
without it.

``stop_daemon(name)`` / ``restart_cluster()`` let fault tests take a daemon away
(e.g. slurmdbd, so sacct fails) and bring the cluster back.
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
from helpers.deadlines import deadline
from helpers.paths import REPO

UP_SH = REPO / "slurm" / "testcluster" / "up.sh"
DOWN_SH = REPO / "slurm" / "testcluster" / "down.sh"
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
# generous: a cold start may apt-get install ~100 MB of packages
UP_TIMEOUT_S = float(os.environ.get("MOR_SLURM_UP_TIMEOUT", "900"))

OPT_IN_HINT = ("Slurm cluster tests are opt-in (as root they apt-get install Slurm and start daemons): "
               "run them with MOR_TESTS=all bash scripts/test.sh (or MOR_TESTS=slurm)")


class _Session:
    """What this pytest session did to the machine, so that it can be undone."""

    ready = False
    failure: str | None = None  # why the cluster cannot be had: every later Slurm test fails with it at once
    started_daemons = False  # up.sh started at least one daemon (the cluster was not already whole)
    jobs_before: set[str] | None = None  # job ids in the queue before the session's first test


def components_asked() -> set[str]:
    """The names MOR_TESTS lists (comma-separated, case-insensitive); "all" stands for every one."""
    return {n.strip().lower() for n in os.environ.get("MOR_TESTS", "").split(",") if n.strip()}


def slurm_tests_enabled() -> bool:
    """MOR_TESTS is "all" or a comma-separated list that names "slurm"."""
    return bool(components_asked() & {"all", "slurm"})


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
        subprocess.run(["sinfo", "-h"], check=True, capture_output=True, timeout=deadline(20))
        subprocess.run(["sacct", "-n", "-X", "-S", "now-1minutes"], check=True,
                       capture_output=True, timeout=deadline(20))
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _pid_alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def daemon_pids() -> dict[str, int]:
    """The test cluster's daemons that run now: name -> pid (from <state>/run/NAME.pid)."""
    out = {}
    for name in DAEMONS:
        try:
            pid = int((state_dir() / "run" / f"{name}.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == name and _pid_alive(pid):
            out[name] = pid
    return out


def _queue() -> set[str]:
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True, timeout=deadline(30),
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(out.split())


def _fail(reason: str):
    _Session.failure = reason
    pytest.fail(reason, pytrace=False)


def ensure_cluster() -> None:
    """Make sure the loopback Slurm test cluster is up; skip if not asked for, fail if it cannot be had."""
    if not slurm_tests_enabled():  # before up.sh: nothing is installed or started
        pytest.skip(OPT_IN_HINT)
    if _Session.failure:
        pytest.fail(f"(as for the first Slurm test) {_Session.failure}", pytrace=False)
    if _Session.ready:
        return
    if not sys.platform.startswith("linux"):
        _fail("MOR_TESTS asks for the Slurm tests, but the Slurm test cluster needs Linux")
    if os.geteuid() != 0:
        _use_cluster_env()
        if _cluster_answers():
            _Session.ready = True
            _Session.jobs_before = _queue()
            return
        _fail("MOR_TESTS asks for the Slurm tests, but no cluster answers and this is not root, so the test "
              "cluster cannot be started (run `sudo slurm/testcluster/up.sh` first)")
    before = daemon_pids()
    try:
        proc = subprocess.run(["bash", str(UP_SH)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=deadline(UP_TIMEOUT_S))
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or b""
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
        _stop_what_up_started(before)
        _fail(f"MOR_TESTS asks for the Slurm tests, but {UP_SH} timed out after {UP_TIMEOUT_S:.0f}s:\n{err[-6000:]}")
    _Session.started_daemons = daemon_pids() != before
    if proc.returncode != 0:
        _stop_what_up_started(before)  # the fixture's teardown never runs after a failed set-up
        _fail(f"MOR_TESTS asks for the Slurm tests, but {UP_SH} failed (rc={proc.returncode}; 2: not root, "
              f"3: packages not installable):\n{(proc.stdout + proc.stderr)[-6000:]}")
    _use_cluster_env()
    _Session.ready = True
    _Session.jobs_before = _queue()


def _stop_what_up_started(before: dict[str, int]) -> None:
    """After a failed up.sh: down.sh if it left daemons running that were not running before."""
    now = daemon_pids()
    if any(before.get(name) != pid for name, pid in now.items()) and os.environ.get("MOR_KEEP_SLURM") != "1":
        subprocess.run(["bash", str(DOWN_SH)], stdin=subprocess.DEVNULL, capture_output=True, timeout=deadline(300), check=False)
        for pid in now.values():
            reap(pid)


def release_cluster() -> list[str]:
    """End of session: cancel the jobs the session submitted and, if it started daemons, stop
    them all (down.sh) unless MOR_KEEP_SLURM=1. Returns what was done, for the log."""
    if not _Session.ready:
        return []
    done = []
    new = sorted(_queue() - (_Session.jobs_before or set()), key=int)
    if new:
        subprocess.run(["scancel", *new], capture_output=True, timeout=deadline(30), check=False)
        done.append(f"cancelled Slurm jobs {' '.join(new)}")
    if _Session.started_daemons and os.environ.get("MOR_KEEP_SLURM") != "1" and os.geteuid() == 0:
        pids = daemon_pids()
        proc = subprocess.run(["bash", str(DOWN_SH)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=deadline(300), check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{DOWN_SH} failed (rc={proc.returncode}):\n{proc.stdout + proc.stderr}")
        for pid in pids.values():
            reap(pid)
        done.append(f"stopped the test cluster's daemons ({', '.join(sorted(pids))})")
    _Session.ready = False
    return done


def reap(pid: int) -> None:
    """Collect a stopped daemon's exit status if it is this process's child (it is when the
    session is a subreaper, see conftest), so it does not stay a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_daemon(name: str, within_s: float = 30) -> None:
    """SIGTERM one daemon up.sh started (pid in <state>/run/NAME.pid) and wait until it is gone.

    Only the test cluster's own daemons, as root: a fault test must never touch a cluster
    it did not start.
    """
    if os.geteuid() != 0:
        pytest.fail(f"stopping {name} needs root and the test cluster's own daemons", pytrace=False)
    pid_file = state_dir() / "run" / f"{name}.pid"
    pid = int(pid_file.read_text())
    comm = Path(f"/proc/{pid}/comm")
    assert comm.exists() and comm.read_text().strip() == name, f"pid {pid} in {pid_file} is not {name}"
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + deadline(within_s)  # a hang bound, scaled by the machine factor
    while _pid_alive(pid):
        assert time.monotonic() < end, f"{name} (pid {pid}) still running {deadline(within_s):.0f}s after SIGTERM"
        time.sleep(0.2)
    reap(pid)


def restart_cluster() -> None:
    """up.sh again: it restarts whatever daemon is not running and waits until sacct answers.

    A cluster that was running before the session (the session started none of its daemons) is
    the machine's, and outlives the session: a daemon restarted here goes back to it without the
    session's MOR_SUITE_ID, which would otherwise mark it as left behind by the suite
    (tests/helpers/machine_state.py). A cluster the session started carries the id and is
    stopped at the session's end (``release_cluster``)."""
    env = dict(os.environ)
    if not _Session.started_daemons:
        env.pop("MOR_SUITE_ID", None)
    proc = subprocess.run(["bash", str(UP_SH)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=deadline(UP_TIMEOUT_S), check=False, env=env)
    assert proc.returncode == 0, f"{UP_SH} failed (rc={proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"
