"""A local job's two ties: it stops when the workflow that started it dies, and it is the only
writer of its run folder (layer: launch; no torch).

Why the first: Snakemake runs a local job as ``bash -c "... python -m mor.launch train ..."``
under its own process. A SIGTERM or Ctrl-C to Snakemake kills its jobs; a SIGKILL (an OOM
killer, a ``kill -9``, a closed terminal that took it down hard) does not, and the trainer
trains on, orphaned, while a re-run of the workflow starts a second trainer on the same
checkpoints. So the Snakefile's parse (``mor.workflow_guard``) puts the Snakemake process's pid
in ``$MOR_WORKFLOW_PID``; a local job that finds that pid among its ancestors watches it (a
pidfd, an event the kernel raises when the process ends; polling where pidfds are missing) and
sends itself SIGTERM when it is gone: a train job then stops at the end of its step with a
checkpoint (``mor.train.stop``), exit 75, and the next run resumes there. PR_SET_PDEATHSIG also
sends it SIGTERM if the shell between them dies. A job started by hand (no such ancestor) is
never watched: ``nohup python -m mor train ... &`` keeps running after its terminal closes.

Why the second: whatever the reason for two writers (a watcher that could not act, a second
workflow in another folder on the same ``runs/``), checkpoints and logs written by two
processes at once are mixed. A train job holds an exclusive ``flock`` on
``runs/.<run_id>.writer.lock`` while it runs (the kernel drops it however the process
ends, SIGKILL included); a second one waits for it (``$MOR_LEASE_WAIT_S``, default 300 s: the
time an orphan needs to finish its step and checkpoint) and then refuses, naming the holder.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

WORKFLOW_PID_ENV = "MOR_WORKFLOW_PID"
LEASE_WAIT_ENV = "MOR_LEASE_WAIT_S"
LEASE_WAIT_S = 300.0
_PR_SET_PDEATHSIG = 1


class LeaseError(RuntimeError):
    """Another process holds the run folder; the message names it and what to do."""


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` from /proc (None once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def ancestors(pid: int | None = None) -> list[int]:
    """The pids above ``pid`` (default this process), nearest first, up to init."""
    out, cur = [], parent_of(os.getpid() if pid is None else pid)
    while cur and cur not in out:
        out.append(cur)
        cur = parent_of(cur) if cur != 1 else None
    return out


def workflow_pid() -> int | None:
    """The Snakemake process that started this job, if it is still an ancestor."""
    try:
        pid = int(os.environ.get(WORKFLOW_PID_ENV, ""))
    except ValueError:
        return None
    return pid if pid in ancestors() else None


def _stop_self(pid: int) -> None:
    print(f"mor: the workflow that started this job (Snakemake, pid {pid}) is gone: stopping this job "
          "(a train job checkpoints at the end of its step; running the workflow again resumes it)",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def _set_parent_death_signal(sig: int) -> None:
    """PR_SET_PDEATHSIG: ``sig`` to this process when its parent (the job's shell) ends (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def watch_workflow(on_gone: Callable[[int], None] = _stop_self) -> int | None:
    """When this job runs under a workflow (``$MOR_WORKFLOW_PID`` an ancestor), call
    ``on_gone(pid)`` from a daemon thread as soon as that process ends; returns the pid watched,
    None when there is none. If the workflow ended before the watch began, ``on_gone`` runs at once."""
    pid = workflow_pid()
    if pid is None:
        return None
    _set_parent_death_signal(signal.SIGTERM)
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if pid not in ancestors():  # it ended (and its pid may be reused) between the check and the open
        if fd is not None:
            os.close(fd)
        on_gone(pid)
        return pid

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the process has ended
            os.close(fd)
        else:
            while pid in ancestors():
                time.sleep(1.0)
        on_gone(pid)

    threading.Thread(target=wait, name=f"mor-watch-workflow-{pid}", daemon=True).start()
    return pid


def lease_path(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    return run_dir.parent / f".{run_dir.name}.writer.lock"


def lease_wait_s() -> float:
    return float(os.environ.get(LEASE_WAIT_ENV, LEASE_WAIT_S))


@contextlib.contextmanager
def run_lease(run_dir: Path, wait_s: float | None = None, what: str = "job") -> Iterator[Path]:
    """Hold the run folder's writer lock for the block; wait up to ``wait_s`` for another
    holder to let go, then raise ``LeaseError`` naming it."""
    wait_s = lease_wait_s() if wait_s is None else wait_s
    path = lease_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    try:
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                if time.monotonic() >= deadline:
                    raise LeaseError(
                        f"{run_dir}: another writer holds this run ({holder}); a second {what} would write the same "
                        f"checkpoints and log. Wait for it to finish, or stop it (kill -TERM <its pid>: a train job "
                        f"checkpoints and exits), then run this again. Lock: {path}") from None
                if not told:
                    print(f"mor: waiting up to {wait_s:.0f}s for the writer of {run_dir} ({holder}) to stop",
                          file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                  .encode(), 0)
        yield path
    finally:
        os.close(fd)  # drops the lock; the file stays (the lock, not the file, is the truth)
