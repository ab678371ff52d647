"""Stale Snakemake locks after a hard kill, cleared without a manual ``--unlock``.

Snakemake marks a working directory as busy with plain files under ``.snakemake/locks/``
and removes them when it exits. A workflow killed with SIGKILL (or a login node that
reboots) cannot remove them, and the next run refuses to start until someone runs
``snakemake --unlock``. Those files cannot tell a live owner from a dead one; a kernel lock
can: every Snakemake process of this workflow holds a shared ``flock`` on
``.snakemake/mor-workflow.flock`` from the moment it parses the Snakefile until it exits,
when the kernel drops it, however the process ends. Before taking it, a process tries for
the exclusive flock: getting it proves no other Snakemake of this workflow is alive in this
directory, so any lock files are stale and it removes them. Otherwise it leaves them, and
Snakemake reports the live run as usual.

The same parse puts this process's pid in ``$MOR_WORKFLOW_PID``, which every job it starts
inherits: a local job watches that process and stops when it is gone, and a train job holds
its run folder's writer lock (``mor.launch.lease``), so a workflow killed with SIGKILL leaves no
trainer behind and a re-run never adds a second writer.

The flock file lives on the working directory's file system. On a cluster, run one
workflow per directory from one login node at a time (flock over NFS is node-local on some
sites); the Slurm launcher's ``job.json`` records keep a re-run from double-submitting.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from pathlib import Path

_held: list[int] = []  # the flock's file descriptor, held for the life of this process
FLOCK = "mor-workflow.flock"  # under .snakemake/


def workflow_alive(workdir: str | Path = ".") -> bool:
    """Whether a Snakemake of this workflow holds its flock in ``workdir`` now (without taking it)."""
    path = Path(workdir) / ".snakemake" / FLOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def clear_stale_locks(workdir: str | Path = ".") -> bool:
    """Remove Snakemake's lock files if no other workflow is alive in ``workdir``, then hold
    the shared workflow flock for the life of this process. True if lock files were removed."""
    meta = Path(workdir) / ".snakemake"
    meta.mkdir(parents=True, exist_ok=True)
    # the local jobs this Snakemake starts watch this pid and stop when it is gone (mor.launch.lease)
    os.environ["MOR_WORKFLOW_PID"] = str(os.getpid())
    if _held:
        return False
    fd = os.open(meta / FLOCK, os.O_RDWR | os.O_CREAT, 0o644)  # O_CLOEXEC: jobs never hold it
    _held.append(fd)
    removed = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another workflow is alive here: its locks are real, and kept
        locks = meta / "locks"
        if locks.is_dir() and any(locks.iterdir()):
            print(f"mor: another Snakemake workflow is running in {meta.parent.resolve()}; its locks are kept "
                  "(wait for it to finish, or run this one in another directory)", file=sys.stderr, flush=True)
    else:
        locks = meta / "locks"
        if locks.is_dir() and any(locks.iterdir()):
            shutil.rmtree(locks, ignore_errors=True)
            print(f"mor: removed stale Snakemake locks in {locks} (left by a workflow that was killed)", flush=True)
            removed = True
    fcntl.flock(fd, fcntl.LOCK_SH)  # from here on, others see this workflow as alive
    return removed
