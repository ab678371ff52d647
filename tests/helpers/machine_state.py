"""What a test session leaves on the machine (helper and command, not a test module).

    python tests/helpers/machine_state.py snapshot BEFORE.json    # before the suite
    MOR_SUITE_ID=... pytest ...                                   # every process it starts inherits the id
    python tests/helpers/machine_state.py check BEFORE.json       # after: exit 1 if anything was left

``check`` compares three things with the snapshot and prints each list:

- processes still running that carry this session's ``MOR_SUITE_ID`` in their environment
  (the suite's daemons, jobs, browsers, workflows; the id is inherited through setsid and
  sudo-less daemonising, and no other process has it);
- listening TCP ports (``/proc/net/tcp*``, state LISTEN) that were not listening before;
- files and symbolic links outside the repository and the temporary folders that were
  added, removed or changed (size, modification time, mode or link target). Directories
  count through their entries only, so a link made and removed again leaves no trace.
  A file that some process already held open for writing when the snapshot was taken (the
  CI runner's own log, a system journal) may change: the suite had not started then, so
  whoever writes it is not the suite. So may the files this check's own standard output and
  error, or its ancestors', lead to (``.ci/run > log``: the runner's log grows as it runs).

Kept outside the comparison: /proc, /sys, /dev, the repository, ``$TMPDIR``/``/tmp``,
``/var/tmp``, and the paths in ``MOR_STATE_IGNORE`` (colon-separated).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as a script (python tests/helpers/machine_state.py): the helpers package is one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import procs  # noqa: E402
from helpers.paths import REPO  # noqa: E402

SKIP = {"/proc", "/sys", "/dev", "/tmp", "/var/tmp", tempfile.gettempdir(), str(REPO)}


def _skipped() -> set[str]:
    extra = {p for p in os.environ.get("MOR_STATE_IGNORE", "").split(":") if p}
    return SKIP | extra


def files(root: str = "/") -> dict[str, list]:
    """path -> [kind, size, mtime_ns, mode] for files, [link, target] for links (one file system)."""
    out: dict[str, list] = {}
    skip = _skipped()
    dev = os.lstat(root).st_dev
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            p = e.path
            if p in skip:
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                try:
                    out[p] = ["link", os.readlink(p)]
                except OSError:
                    pass
            elif stat.S_ISDIR(st.st_mode):
                if st.st_dev == dev:
                    stack.append(p)
            elif stat.S_ISSOCK(st.st_mode) or stat.S_ISFIFO(st.st_mode):
                out[p] = ["socket", 0, 0, st.st_mode]
            else:
                out[p] = ["file", st.st_size, st.st_mtime_ns, st.st_mode]
    return out


def open_for_writing() -> dict[str, list[int]]:
    """path -> pids of every regular file some live process holds open for writing.

    Read from ``/proc/PID/fd`` (the target) and ``/proc/PID/fdinfo`` (the open flags:
    O_WRONLY or O_RDWR); processes whose fds cannot be read (another user's, without root)
    are skipped, so without root this covers only one's own processes.
    """
    out: dict[str, list[int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if not target.startswith("/") or target.endswith(" (deleted)"):
                    continue
                flags = next(ln for ln in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                             if ln.startswith("flags:"))
                if int(flags.split()[1], 8) & (os.O_WRONLY | os.O_RDWR) and os.path.isfile(target):
                    out.setdefault(target, []).append(int(pid))
            except (OSError, StopIteration, ValueError):
                continue
    return out


def ancestors_output() -> set[str]:
    """The regular files that fds 1 and 2 of this process and of each of its ancestors lead to."""
    out, pid = set(), os.getpid()
    while pid > 1:
        for fd in (1, 2):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/") and os.path.isfile(target):
                out.add(target)
        s = procs.stat(pid)
        if s is None:
            break
        pid = s["ppid"]
    return out


def listening_ports() -> list[int]:
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            parts = ln.split()
            if parts[3] == "0A":  # LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def suite_processes(suite_id: str) -> list[str]:
    """'pid comm: cmdline' of every live process whose environment carries MOR_SUITE_ID=suite_id."""
    marker = f"MOR_SUITE_ID={suite_id}".encode()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if marker not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                continue
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append(f"{pid} {comm}: {cmd[:200]}")
    return out


def snapshot(root: str = "/") -> dict:
    return {"ports": listening_ports(), "files": files(root), "writers": open_for_writing()}


def compare(before: dict, suite_id: str | None, root: str = "/") -> dict[str, list[str]]:
    now = snapshot(root)
    a, b = before["files"], now["files"]
    others = set(before.get("writers", {})) | ancestors_output()  # not written by the suite
    return {
        "processes left running": suite_processes(suite_id) if suite_id else [],
        "ports left listening": [str(p) for p in sorted(set(now["ports"]) - set(before["ports"]))],
        "files added": sorted(set(b) - set(a)),
        "files removed": sorted(set(a) - set(b)),
        "files changed": sorted(p for p in set(a) & set(b) if a[p] != b[p] and p not in others),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[1])
    if argv[0] == "snapshot":
        path.write_text(json.dumps(snapshot()))
        return 0
    diff = compare(json.loads(path.read_text()), os.environ.get("MOR_SUITE_ID"))
    for what, items in diff.items():
        print(f"machine state: {what}: {len(items)}")
        for item in items[:50]:
            print(f"  {item}")
    return 1 if any(diff.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
