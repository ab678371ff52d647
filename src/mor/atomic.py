"""Crash-safe file writes: every file or folder a job leaves is either the old one or the
whole new one, never half of either; and the one file digest used to check that later.

A writer fills a temporary sibling with a name no other writer can pick (host, pid and a
random part), flushes it to disk and renames it over the target (``os.replace``, atomic on
POSIX). A folder cannot be renamed over a non-empty folder, so ``replace_dir`` moves the old
one aside first: a kill between the two renames leaves the target absent (a reader then
redoes the work or falls back, see ``mor.train.checkpoint``), never mixed. Temporaries are
hidden (leading dot), so globs such as ``step-*`` never see them; those left by a killed
writer on this host are removed by ``remove_stale``, which every write calls on its folder.
Every file put in place gets the process umask's mode (0644 under umask 022), as ``open``
would give it: some writers (safetensors' ``save_file``) create their file 0600, and a
co-author on a shared cluster could not read the run's weights.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any, Iterator

_HOST = socket.gethostname().replace("-", "_").replace(".", "_")


def temp_sibling(path: Path, kind: str = "tmp") -> Path:
    """``dir/.name.<kind>-<host>-<pid>-<random>``: unique to this writer."""
    path = Path(path)
    return path.with_name(f".{path.name}.{kind}-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def sha256_file(path: str | Path) -> str:
    """sha256 of a file, read in 8 MiB blocks (bounded memory at any size): the digest every
    manifest, checkpoint and summary of this project records to tell a whole file from a
    damaged one."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def umask() -> int:
    """The process umask, read without changing it (Linux: /proc/self/status), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_files(path: str | Path) -> None:
    """Give ``path`` (a file, or every file under a folder) the mode ``open`` would: 0666 less
    the umask (0777 less the umask for a file some execute bit is set on)."""
    path = Path(path)
    files = [path] if not path.is_dir() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    mask = umask()
    for f in files:
        mode = (0o777 if f.stat().st_mode & 0o111 else 0o666) & ~mask
        os.chmod(f, mode)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to; on success it replaces ``path``.

    For writers that want a file name (safetensors ``save_file``, ``pq.write_table``). On an
    exception the temporary is removed and ``path`` is untouched.
    """
    path = Path(path)
    remove_stale(path.parent)  # what a killed writer of this folder left (cheap: one listing)
    tmp = temp_sibling(path)
    try:
        yield tmp
        _fsync_file(tmp)
        share_files(tmp)
        os.replace(tmp, path)
    except Exception as e:
        if out_of_space(e):  # writers (pyarrow, safetensors) say so without naming the file
            raise OSError(errno.ENOSPC, f"No space left on device while writing {path}; the previous "
                                        f"{path.name} (if any) is unchanged: free space and run again") from e
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def out_of_space(e: BaseException) -> bool:
    """ENOSPC, as an OSError or quoted by a writer's own exception (safetensors: 'os error 28')."""
    return getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True))


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the complete folder ``tmp`` at ``final``, replacing any old ``final``."""
    tmp, final = Path(tmp), Path(final)
    share_files(tmp)
    old = None
    if final.exists():
        old = temp_sibling(final, "old")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale(directory: Path) -> list[Path]:
    """Remove temporaries in ``directory`` whose writer (on this host) no longer runs."""
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for p in directory.glob(".*"):
        parts = p.name.rsplit(".", 1)[-1].split("-")
        if len(parts) != 4 or parts[0] not in ("tmp", "old") or parts[1] != _HOST or not parts[2].isdigit():
            continue
        if _pid_alive(int(parts[2])):  # a live writer (this process included) is still filling it
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed
