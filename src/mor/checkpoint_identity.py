"""A checkpoint folder's identity, for runs that import one (``model.import_checkpoint``).

    folder_files("ckpt/")   -> {"config.json": "<sha256>", "pytorch_model.bin": "<sha256>", ...}
    folder_digest("ckpt/")  -> the sha256 of that listing: the folder's identity
    resolve_import(run)     -> run with model.import_sha256 set from its folder (grid load)

Why: an imported run's weights are the folder's, not a training's, so its run id must change
with the folder's bytes (two checkpoints never share a run folder) and with its path (an edited
path is never silently ignored). The grid loader resolves the digest once, at the boundary, into
``model.import_sha256``; a stored config (config.json, a result row) carries it and is read
without the folder. A digest written in the grid pins the checkpoint: a folder whose files
changed is refused. Torch-free, like ``mor.budget``'s ``resolve_budget``, which it sits beside.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from mor.atomic import sha256_file
from mor.config import ConfigError, RunConfig

WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")  # what their save_pretrained writes (mor.checkpoints.authors)
_CACHE: dict[tuple, dict[str, str]] = {}  # (folder, its files' sizes and mtimes) -> folder_files


def folder_files(folder: str | Path) -> dict[str, str]:
    """Every file under ``folder`` (relative POSIX path, sorted) -> its sha256. Hashed once per
    process while no file's size or mtime changes (Snakemake asks for every run's id many times)."""
    folder = Path(folder)
    files = sorted(f for f in folder.rglob("*") if f.is_file())
    key = (str(folder.resolve()), tuple((f.as_posix(), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _CACHE:
        _CACHE[key] = {f.relative_to(folder).as_posix(): sha256_file(f) for f in files}
    return dict(_CACHE[key])


def folder_digest(folder: str | Path) -> str:
    """The sha256 of the folder's listing (paths and their sha256s, canonical JSON)."""
    blob = json.dumps(folder_files(folder), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def check_folder(path: str | Path) -> Path:
    """``path`` as a checkpoint folder their trainer saved, else a ConfigError naming the key."""
    p = Path(path)
    key = f"model.import_checkpoint={str(path)!r}"
    if not p.is_dir():
        raise ConfigError(f"{key}: no such folder (a relative path is read from the workflow's working "
                          f"directory, {Path.cwd()})")
    if not (p / "config.json").is_file():
        raise ConfigError(f"{key}: the folder has no config.json (not a save_pretrained checkpoint)")
    if not any((p / w).is_file() for w in WEIGHT_FILES):
        raise ConfigError(f"{key}: the folder has no weights ({' or '.join(WEIGHT_FILES)}; sharded checkpoints "
                          "are not supported)")
    return p


def resolve_import(run: RunConfig) -> RunConfig:
    """``run`` with ``model.import_sha256`` set from its checkpoint folder (unchanged when it
    imports none). A digest already set must be the folder's: the grid pinned that checkpoint."""
    m = run.model
    if not m.import_checkpoint:
        return run
    digest = folder_digest(check_folder(m.import_checkpoint))
    if m.import_sha256 and m.import_sha256 != digest:
        raise ConfigError(f"model.import_sha256={m.import_sha256!r}: the files of {m.import_checkpoint} hash to "
                          f"{digest}: the checkpoint changed since the grid pinned it (update the pin, or point "
                          "model.import_checkpoint at the checkpoint it names)")
    return dataclasses.replace(run, model=dataclasses.replace(m, import_sha256=digest))
