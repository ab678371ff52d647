"""Where the FineWeb-Edu documents come from: a hub dataset or a local copy, read in order.

Why one reader for both: the cluster streams ``HuggingFaceTB/smollm-corpus`` /
``fineweb-edu-dedup`` from the hub, a site may have pre-downloaded it, and the tests write a
small local dataset of the same schema (a ``text`` column in parquet or JSON files). All three
go through ``datasets``: ``load_dataset_builder`` resolves the source to its ordered list of
data files (hub files come back as ``hf://...@<commit>/...`` URLs, so the revision is pinned),
and each file is streamed on its own (``load_dataset(<builder>, data_files=[file],
streaming=True)``), so a document's place is (file, row): a resumed job skips to it exactly,
and memory never holds more than one batch of documents.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from mor.data.shards import Position


class SourceError(ValueError):
    """The dataset cannot be resolved or read; the message names it."""


@dataclass(frozen=True)
class SourceSpec:
    """What ``datasets.load_dataset_builder`` is given (the ``source:`` block of the settings)."""

    path: str = "HuggingFaceTB/smollm-corpus"  # hub id, or a local folder of parquet / JSON files
    name: str | None = "fineweb-edu-dedup"  # the dataset config (subset); null for a plain folder
    revision: str | None = None  # hub branch, tag or commit; null = main (resolved to a commit)
    data_files: str | list[str] | None = None  # optional glob(s), relative to path
    text_column: str = "text"


@dataclass(frozen=True)
class ResolvedSource:
    """The source's data files in reading order, and the ``datasets`` builder that reads them."""

    spec: SourceSpec
    builder: str  # parquet | json | csv | arrow ...
    files: tuple[str, ...]
    revision: str | None  # the hub commit the files come from (None for a local copy)

    def describe(self) -> dict:
        return {**asdict(self.spec), "builder": self.builder, "files": list(self.files),
                "resolved_revision": self.revision}


_COMMIT = re.compile(r"@([0-9a-f]{40})/")


def resolve(spec: SourceSpec) -> ResolvedSource:
    """Resolve ``spec`` to its ordered train files (no data is read)."""
    from datasets import load_dataset_builder

    path = str(Path(spec.path).resolve()) if Path(spec.path).exists() else spec.path  # a local copy
    try:
        builder = load_dataset_builder(path, spec.name, revision=spec.revision, data_files=spec.data_files)
    except Exception as e:  # datasets raises many kinds (FileNotFoundError, DatasetNotFoundError, ValueError)
        hint = ""
        if Path(spec.path).exists() and spec.name:  # a downloaded snapshot is a plain folder: it has no configs
            hint = (f"; a local copy has no dataset configs: set name: null and data_files: '{spec.name}/*.parquet' "
                    "(the folder `hf download ... --include '<subset>/*' --local-dir` writes)")
        raise SourceError(f"dataset {spec.path!r} (config {spec.name!r}, revision {spec.revision!r}) cannot be "
                          f"resolved: {type(e).__name__}: {e}{hint}") from None
    module = type(builder).__module__
    if not module.startswith("datasets.packaged_modules."):
        raise SourceError(f"dataset {spec.path!r} needs a loading script ({module}); only file-based datasets "
                          "(parquet, JSON, ...) can be streamed file by file")
    files = (builder.config.data_files or {}).get("train")
    if not files:
        raise SourceError(f"dataset {spec.path!r} (config {spec.name!r}) has no 'train' data files")
    files = tuple(str(f) for f in files)
    commits = {m.group(1) for f in files if (m := _COMMIT.search(f))}
    return ResolvedSource(spec, module.split(".")[2], files, commits.pop() if len(commits) == 1 else None)


def read_batches(src: ResolvedSource, start: Position, stop_file: int, batch_docs: int
                 ) -> Iterator[tuple[Position, list[str]]]:
    """(position of the first document, texts) for consecutive batches from ``start`` on.

    Reads files ``start.file`` .. ``stop_file - 1`` in order; only the first batch's first
    document carries ``start.offset`` (the tokens of it already written).
    """
    from datasets import load_dataset

    col = src.spec.text_column
    offset = start.offset
    for fi in range(start.file, stop_file):
        row = start.row if fi == start.file else 0
        ds = load_dataset(src.builder, data_files=[src.files[fi]], split="train", streaming=True)
        names = ds.column_names
        if names is not None and col not in names:
            raise SourceError(f"{src.files[fi]}: no {col!r} column (it has {names}); set source.text_column")
        ds = ds.select_columns([col])
        if row:
            ds = ds.skip(row)
        for batch in ds.iter(batch_size=batch_docs):
            texts = batch[col]
            if any(not isinstance(t, str) for t in texts):
                raise SourceError(f"{src.files[fi]}: column {col!r} holds non-text values near row {row}")
            yield Position(fi, row, offset), texts
            offset = 0
            row += len(texts)


def file_label(path: str) -> str:
    """A short name for messages: the file name of a path or URL."""
    return Path(path.split("::")[-1]).name
