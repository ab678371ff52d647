"""Processes as ``/proc`` shows them (a helper of the test helpers, not a test module): the one
reader of ``/proc/PID/stat`` that tests/browser.py, tests/chaos.py and tests/machine_state.py
share."""

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
