"""Processes as ``/proc`` shows them: the one reader of ``/proc/PID/stat`` that
helpers/browser.py, helpers/chaos.py and helpers/machine_state.py share; and ``run_group``,
a command in a process group of its own that is killed as one when the wait ends early."""

from __future__ import annotations

import os
from pathlib import Path

# fields of /proc/PID/stat after the ")" that ends the command name (proc(5): state is field 3)
FIELDS = {"state": 0, "ppid": 1, "pgrp": 2, "session": 3}


def stat(pid: int) -> dict[str, str | int] | None:
    """state, ppid, pgrp and session of a process (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return {k: fields[i] if k == "state" else int(fields[i]) for k, i in FIELDS.items()}


SIGSTOP_BIT = 1 << (19 - 1)  # SIGSTOP in the hex masks of /proc/PID/status (signal 19 on Linux)


def frozen(pid: int) -> bool:
    """Whether a process can run no more user code until SIGCONT: it is stopped ("T"/"t"), or a
    SIGSTOP is pending for it. The second case is real: a process that is vfork()ing a child
    (Python's subprocess does) waits in "D" for the child's exec; a group SIGSTOP stops the child
    first, so the parent stays "D" with the SIGSTOP pending until SIGCONT (seen 3 times in 200
    tries; once in CI, where a wait for every member to read "T" hung)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return True  # gone: it runs nothing
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    state = fields.get("State", "").strip()[:1]
    if state in ("T", "t", "Z", "X"):
        return True
    pending = int(fields.get("ShdPnd", "0"), 16) | int(fields.get("SigPnd", "0"), 16)
    return bool(pending & SIGSTOP_BIT)


def members(key: str, value: int, reap: bool = False) -> list[int]:
    """Live processes whose ``key`` ('pgrp' or 'session') is ``value``. Zombies are never
    counted; with ``reap`` they are reaped too (this process may be their subreaper, see
    tests/conftest.py)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        s = stat(int(pid))
        if s is None or s[key] != value:
            continue
        if s["state"] == "Z":
            if reap:
                try:
                    os.waitpid(int(pid), os.WNOHANG)
                except ChildProcessError:
                    pass
            continue
        out.append(int(pid))
    return out


def run_group(cmd: list[str], timeout: float, **kw) -> "subprocess.CompletedProcess":
    """subprocess.run(cmd, capture_output=True, text=True) in a session of its own, whose whole
    process group is killed if the wait ends early (timeout, a failed test, Ctrl-C): a
    workflow's jobs are the command's grandchildren and would outlive a plain kill."""
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
