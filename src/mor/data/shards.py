"""Sharded token arrays: fixed-size ``.npy`` shards plus a manifest, read as one logical array.

Why: a paper-scale corpus (20 B tokens = 40 GB as uint16) cannot be built in memory or as one
file written in one go. Shards of ``shard_tokens`` tokens are written one at a time, each
through a hidden temporary renamed into place (``mor.atomic``), so a killed writer leaves
only whole shards, and resuming starts at the first shard that is not there. The manifest
lists every shard with its token count and sha256, so a damaged shard is caught by name
before a training job reads it.

Layout of one split (``<dir>/manifest.json`` is what rules and jobs point at)::

    <dir>/shard-00000.npy ...   uint16 when the vocabulary fits, else uint32, 1-D
    <dir>/manifest.json         format, dtype, tokens, shards[{file, tokens, bytes, sha256, start, end}],
                                plus whatever the writer adds (tokenizer, source, documents)

``start`` / ``end`` are the source positions (file, row, token offset inside that row's
document) of a shard's first token and of the token after its last: enough to regenerate
any shard alone, and to resume after the last finished one.

The flat ``.npy`` files of the local corpus stay as they are; ``load_tokens`` reads both,
so training has one code path (``mor.data.sampler.load_tokens``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from mor.atomic import atomic_path, sha256_file

FORMAT = "mor-token-shards/1"
MANIFEST = "manifest.json"


class ShardError(ValueError):
    """A sharded token set is incomplete or damaged; the message names the file."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab <= 65536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npy"


@dataclass(frozen=True)
class Position:
    """A place in the source: document ``row`` of data file ``file``, ``offset`` tokens into it.

    A document's tokens include the EOS that follows it, so ``offset`` is < its length + 1.
    """

    file: int
    row: int
    offset: int = 0

    def as_dict(self) -> dict:
        return {"file": self.file, "row": self.row, "offset": self.offset}

    @classmethod
    def from_dict(cls, d: dict) -> "Position":
        return cls(int(d["file"]), int(d["row"]), int(d.get("offset", 0)))

    def next_document(self) -> "Position":
        """The first whole document at or after this position."""
        return self if self.offset == 0 else Position(self.file, self.row + 1, 0)


@dataclass(frozen=True)
class Chunk:
    """Consecutive documents' tokens (EOS after each) from one data file, starting at ``start``.

    ``lengths[i]`` is the token count of document ``start.row + i`` as it appears in
    ``tokens`` (the first one is shortened by ``start.offset``).
    """

    start: Position
    tokens: np.ndarray  # (sum(lengths),)
    lengths: np.ndarray  # (documents,) int64


def _write_header(f, n: int, dtype: np.dtype) -> None:
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                             "fortran_order": False, "shape": (n,)})


def _position(chunk: Chunk, ends: np.ndarray, pos: int) -> Position:
    """The source position of token ``pos`` of ``chunk`` (``ends``: its documents' cumulative lengths)."""
    done = int(np.searchsorted(ends, pos, side="right"))  # documents wholly before pos
    if done == len(ends):
        return Position(chunk.start.file, chunk.start.row + done, 0)
    offset = pos - (int(ends[done - 1]) if done else 0) + (chunk.start.offset if done == 0 else 0)
    return Position(chunk.start.file, chunk.start.row + done, offset)


def write_shards(chunks: Iterable[Chunk], out_dir: Path, first_index: int, start: Position, total: int,
                 shard_tokens: int, dtype: np.dtype) -> Iterator[dict]:
    """Write ``total`` tokens from ``chunks`` as shards ``first_index, first_index + 1, ...``.

    Every shard but the last holds ``shard_tokens``; each is streamed to a temporary file
    (no shard is ever held in memory) and renamed into place once whole. Yields one manifest
    entry per finished shard, in order, after its file is in place. Raises ``ShardError`` if
    the chunks end before ``total`` tokens.
    """
    out_dir = Path(out_dir)
    it = iter(chunks)
    chunk, ends, pos = None, None, 0  # current chunk, its documents' end offsets, tokens of it written
    cursor = start
    written, index = 0, first_index
    while written < total:
        n = min(shard_tokens, total - written)
        path = out_dir / shard_name(index)
        shard_start = cursor
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            _write_header(f, n, dtype)
            need = n
            while need:
                if chunk is None or pos == len(chunk.tokens):
                    chunk = next(it, None)
                    if chunk is None:
                        raise ShardError(f"{path}: the source ran out after {written + n - need:,} of "
                                         f"{total:,} tokens (from {start}); ask for fewer tokens")
                    ends, pos = np.cumsum(chunk.lengths), 0
                take = min(need, len(chunk.tokens) - pos)
                f.write(np.ascontiguousarray(chunk.tokens[pos:pos + take], dtype=dtype).tobytes())
                pos += take
                need -= take
            cursor = _position(chunk, ends, pos)
        entry = {"file": path.name, "tokens": n, "bytes": path.stat().st_size, "sha256": sha256_file(path),
                 "start": shard_start.as_dict(), "end": cursor.as_dict()}
        written += n
        index += 1
        yield entry


def read_manifest(path: Path) -> dict:
    """The manifest at ``path`` (a ``manifest.json`` or its folder), with a clear error if unusable."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    if not path.is_file():
        progress = path.with_name("progress.json")
        hint = (f"; {progress} shows an unfinished preparation: run the data rule again to resume it"
                if progress.is_file() else "; run the data rules first (snakemake data)")
        raise FileNotFoundError(f"token manifest {path} not found{hint}")
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"token manifest {path} is not valid JSON ({e}); delete it and run the data rule again") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("shards"), list):
        raise ShardError(f"token manifest {path}: not a {FORMAT} manifest")
    return m


def check_shard(directory: Path, entry: dict, dtype: np.dtype, checksum: bool = True) -> Path:
    """Raise ``ShardError`` naming the shard if it is missing, the wrong size or shape, or fails its sha256."""
    path = Path(directory) / entry["file"]
    fix = "delete it and run the data rule again: it is rewritten from its recorded start"
    if not path.is_file():
        raise ShardError(f"token shard {path} is missing; run the data rule again to rewrite it")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise ShardError(f"token shard {path} has {size} bytes, its manifest says {entry['bytes']}: damaged; {fix}")
    if checksum:
        got = sha256_file(path)
        if got != entry["sha256"]:
            raise ShardError(f"token shard {path} fails its checksum (sha256 {got[:16]}..., manifest "
                             f"{entry['sha256'][:16]}...): damaged; {fix}")
    try:
        arr = np.load(path, mmap_mode="r")
    except ValueError as e:
        raise ShardError(f"token shard {path} is not a readable .npy ({e}); {fix}") from None
    if arr.shape != (entry["tokens"],) or arr.dtype != dtype:
        raise ShardError(f"token shard {path}: shape {arr.shape} {arr.dtype}, manifest says "
                         f"({entry['tokens']},) {dtype}; {fix}")
    return path


class ShardedTokens:
    """The shards of a manifest as one read-only 1-D array: ``len``, slices, ``dtype``.

    Each shard is memory-mapped; a slice that crosses shard boundaries is concatenated, so
    ``tokens[a:b]`` equals the same slice of the flat concatenation.
    """

    ndim = 1

    def __init__(self, manifest: str | Path, checksum: bool = True):
        manifest = Path(manifest)
        if manifest.is_dir():
            manifest = manifest / MANIFEST
        m = read_manifest(manifest)
        self.path, self.manifest = manifest, m
        self.dtype = np.dtype(m["dtype"])
        self._parts = [np.load(check_shard(manifest.parent, e, self.dtype, checksum), mmap_mode="r")
                       for e in m["shards"]]
        self._offsets = np.cumsum([0] + [len(p) for p in self._parts])  # (shards + 1,)
        if int(self._offsets[-1]) != int(m["tokens"]):
            raise ShardError(f"token manifest {manifest}: shards hold {int(self._offsets[-1])} tokens, "
                             f"it says {m['tokens']}")

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            i = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= i < len(self):
                raise IndexError(f"index {key} out of range for {len(self)} tokens")
            s = int(np.searchsorted(self._offsets, i, side="right")) - 1
            return self._parts[s][i - self._offsets[s]]
        if not isinstance(key, slice):
            raise TypeError(f"ShardedTokens supports integers and slices, got {type(key).__name__}")
        start, stop, step = key.indices(len(self))
        if step != 1:
            return self[start:stop][::step]
        if stop <= start:
            return np.zeros(0, self.dtype)
        first = int(np.searchsorted(self._offsets, start, side="right")) - 1
        last = int(np.searchsorted(self._offsets, stop - 1, side="right")) - 1
        pieces = [self._parts[s][max(start - self._offsets[s], 0):min(stop - self._offsets[s], len(self._parts[s]))]
                  for s in range(first, last + 1)]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __array__(self, dtype=None, copy=None):
        arr = self[:]
        return arr.astype(dtype) if dtype is not None else np.asarray(arr)


def is_sharded(path: str | Path) -> bool:
    """A manifest (``*.json``) or a folder holding one, rather than a flat ``.npy``."""
    path = Path(path)
    return path.suffix == ".json" or path.is_dir()
