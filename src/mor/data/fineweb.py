"""Cluster data path: FineWeb-Edu (dedup, SmolLM corpus) tokenized into sharded token sets.

    python -m mor.launch data --settings workflows/config/fineweb.yaml --tokenizer HuggingFaceTB/SmolLM-135M \\
        --out data/tokens/fineweb-edu-HuggingFaceTB--SmolLM-135M [--launcher slurm]

writes ``<out>/val/`` and ``<out>/train/``, each shards plus a ``manifest.json``
(``mor.data.shards``) that training and evaluation read as one array.

Why it is built this way:
- **Bounded memory.** Documents are streamed file by file (``mor.data.source``), tokenized
  a batch at a time on every CPU of the job (``mor.data.encode_pool``) and written to
  fixed-size shards through temporaries; nothing grows with the token count.
- **Resumable.** After each shard, ``progress.json`` records it (size, sha256, and the
  source positions where it starts and ends). A killed or requeued job checks the finished
  shards and goes on from the end of the last one; a finished shard is never rewritten.
  A shard deleted by hand is rewritten from its recorded start, and must come out with its
  recorded checksum. ``manifest.json`` appears last: it is the rule's output.
- **Held-out validation, disjoint by construction.** ``val_split: head`` takes the first
  documents of the corpus (in file order) until ``val_tokens`` tokens, cutting the last one;
  training starts at the next whole document. ``val_split: last_file`` is the authors'
  split: validation is the start of the corpus's last data file, and training never reads
  that file. Documents are taken in file order, unshuffled: the sampler draws random
  windows anyway, and the order is what makes a resumed job byte-identical.
- **Same settings or stop.** A resumed job whose settings, tokenizer or resolved source
  differ from those recorded stops with the difference, rather than mixing two corpora.
"""

from __future__ import annotations

import contextlib
import json
import resource
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from mor.atomic import remove_stale, write_json_atomic
from mor.yaml_io import read_yaml_mapping
from mor.data.encode_pool import available_cpus, encode_batches
from mor.data.shards import FORMAT, MANIFEST, Position, ShardError, check_shard, token_dtype, write_shards
from mor.data.source import ResolvedSource, SourceSpec, file_label, read_batches, resolve

DATASET = "HuggingFaceTB/smollm-corpus"
SUBSET = "fineweb-edu-dedup"
PROGRESS = "progress.json"
VAL_SPLITS = ("head", "last_file")
DEFAULT_SETTINGS = Path(__file__).resolve().parents[3] / "workflows" / "config" / "fineweb.yaml"


class SettingsError(ValueError):
    """The preparation settings file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class PrepSettings:
    """What to prepare (``workflows/config/fineweb.yaml``); the tokenizer comes from the run configs."""

    source: SourceSpec = field(default_factory=SourceSpec)
    train_tokens: int = 20_000_000_000
    val_tokens: int = 10_000_000
    val_split: str = "head"
    shard_tokens: int = 100_000_000  # 200 MB per shard as uint16
    batch_docs: int = 256  # documents per tokenizer task

    @property
    def total_tokens(self) -> int:
        return self.train_tokens + self.val_tokens


def _count(where: str, value) -> int:
    """A positive integer; YAML gives ``20e9`` as a string and ``20.0e9`` as a float."""
    try:
        num = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    except ValueError:
        num = None
    if num is None or not num.is_integer() or num < 1:
        raise SettingsError(f"{where}: expected a whole number >= 1, got {value!r}")
    return int(num)


def load_settings(path: str | Path = DEFAULT_SETTINGS) -> PrepSettings:
    """Parse and validate a settings file; every error names the file and the key."""
    path = Path(path)
    raw = read_yaml_mapping(path, SettingsError, "FineWeb-Edu settings file",
                            missing_hint=" (set --config fineweb=/path/to/fineweb.yaml)")
    allowed = {f.name for f in fields(PrepSettings)}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise SettingsError(f"{path}: unknown key(s) {unknown}; allowed keys are {sorted(allowed)}")
    src_raw = raw.get("source") or {}
    if not isinstance(src_raw, dict):
        raise SettingsError(f"{path}: source: expected a mapping (path, name, revision, data_files, text_column)")
    src_allowed = {f.name for f in fields(SourceSpec)}
    unknown = sorted(set(src_raw) - src_allowed)
    if unknown:
        raise SettingsError(f"{path}: source: unknown key(s) {unknown}; allowed keys are {sorted(src_allowed)}")
    for key in ("path", "text_column"):
        if key in src_raw and (not isinstance(src_raw[key], str) or not src_raw[key]):
            raise SettingsError(f"{path}: source.{key}: expected a non-empty string, got {src_raw[key]!r}")
    for key in ("name", "revision"):
        if src_raw.get(key) is not None and not isinstance(src_raw[key], str):
            raise SettingsError(f"{path}: source.{key}: expected a string or null, got {src_raw[key]!r}")
    files = src_raw.get("data_files")
    if files is not None and not (isinstance(files, str) or (isinstance(files, list) and files
                                                             and all(isinstance(f, str) for f in files))):
        raise SettingsError(f"{path}: source.data_files: expected a glob, a list of globs or null, got {files!r}")
    source = SourceSpec(**src_raw)  # a local path: absolute, or relative to the working directory
    values = {k: _count(f"{path}: {k}", raw[k]) for k in ("train_tokens", "val_tokens", "shard_tokens", "batch_docs")
              if k in raw}
    val_split = raw.get("val_split", "head")
    if val_split not in VAL_SPLITS:
        raise SettingsError(f"{path}: val_split: {val_split!r} is not allowed; choose one of {list(VAL_SPLITS)}")
    return PrepSettings(source=source, val_split=val_split, **values)


# --------------------------------------------------------------------------------------
# One split
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitPlan:
    """Where one split's documents come from: files [start.file, stop_file), from ``start``."""

    name: str  # val | train
    start: Position
    stop_file: int
    tokens: int
    documents: str  # which documents, in words (goes into the manifest)


def _identity(plan: SplitPlan, settings: PrepSettings, src: ResolvedSource, tok, tokenizer: str) -> dict:
    """Everything a split's tokens depend on; a resumed job must find the same."""
    return {"format": FORMAT, "split": plan.name, "dtype": token_dtype(tok.vocab_size).name,
            "tokenizer": {"name": str(tokenizer), "vocab_size": tok.vocab_size, "eos_id": tok.eos_id},
            "source": src.describe(), "start": plan.start.as_dict(), "stop_file": plan.stop_file,
            "tokens": plan.tokens, "shard_tokens": settings.shard_tokens, "val_split": settings.val_split,
            "eos_after_each_document": True}


def _mismatch(recorded: dict, wanted: dict) -> list[str]:
    return [f"{k}: recorded {recorded.get(k)!r}, now {wanted.get(k)!r}"
            for k in sorted(set(recorded) | set(wanted)) if recorded.get(k) != wanted.get(k)]


def _read_progress(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{path} is not valid JSON ({e}); it is written atomically, so this is damage: "
                         "delete the split's folder to prepare it again") from None


def _chunks(src: ResolvedSource, start: Position, stop_file: int, settings: PrepSettings, tokenizer: str,
            dtype, workers: int):
    return encode_batches(read_batches(src, start, stop_file, settings.batch_docs), tokenizer, dtype, workers)


def prepare_split(plan: SplitPlan, directory: Path, settings: PrepSettings, src: ResolvedSource, tok,
                  tokenizer: str, workers: int, log=print) -> dict:
    """Write (or finish, or just check) one split; returns its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale(directory)  # temporaries of a killed writer
    ident = _identity(plan, settings, src, tok, tokenizer)
    dtype = token_dtype(tok.vocab_size)
    progress_path = directory / PROGRESS
    progress = _read_progress(progress_path)
    if progress is not None:
        diff = _mismatch(progress.get("identity", {}), ident)
        if diff:
            raise ShardError(f"{progress_path}: this split was started with other settings; not mixing them:\n  "
                             + "\n  ".join(diff) + f"\n  Restore the settings, or delete {directory} to start over.")
    shards: list[dict] = list(progress["shards"]) if progress else []
    for i, entry in enumerate(shards):  # finished shards: check each (a missing one is rewritten)
        if not (directory / entry["file"]).exists():
            log(f"{plan.name}: {entry['file']} is missing; rewriting it from {entry['start']}")
            _rewrite(entry, i, directory, src, plan, settings, tokenizer, dtype, workers)
        check_shard(directory, entry, dtype, checksum=True)
    done = sum(e["tokens"] for e in shards)
    if done < plan.tokens:
        start = Position.from_dict(shards[-1]["end"]) if shards else plan.start
        log(f"{plan.name}: {len(shards)} shard(s) done ({done:,} tokens); writing {plan.tokens - done:,} more "
            f"from file {start.file} ({file_label(src.files[start.file]) if start.file < len(src.files) else 'end'}) "
            f"row {start.row} with {workers} worker(s)")
        t0 = time.perf_counter()
        gen = write_shards(_chunks(src, start, plan.stop_file, settings, tokenizer, dtype, workers), directory,
                           len(shards), start, plan.tokens - done, settings.shard_tokens, dtype)
        with contextlib.closing(gen):
            for entry in gen:
                shards.append(entry)
                write_json_atomic(progress_path, {"identity": ident, "shards": shards})
                elapsed = time.perf_counter() - t0
                new = sum(e["tokens"] for e in shards) - done
                log(f"{plan.name}: {entry['file']} ({entry['tokens']:,} tokens) done; "
                    f"{new / max(elapsed, 1e-9):,.0f} tok/s")
    elif not progress_path.exists():
        write_json_atomic(progress_path, {"identity": ident, "shards": shards})
    manifest = {**ident, "shards": shards, "documents": plan.documents,
                "end": shards[-1]["end"] if shards else plan.start.as_dict()}
    write_json_atomic(directory / MANIFEST, manifest)
    return manifest


def _rewrite(entry: dict, index: int, directory: Path, src, plan: SplitPlan, settings, tokenizer, dtype,
             workers) -> None:
    """Regenerate one recorded shard from its start; it must reproduce its recorded checksum."""
    start = Position.from_dict(entry["start"])
    gen = write_shards(_chunks(src, start, plan.stop_file, settings, tokenizer, dtype, workers), directory,
                       index, start, entry["tokens"], entry["tokens"], dtype)
    with contextlib.closing(gen):
        new = next(gen)
    if new["sha256"] != entry["sha256"]:
        bad = directory / entry["file"]
        bad.unlink()
        raise ShardError(f"{bad}: rewritten from {entry['start']}, it no longer matches its recorded checksum; "
                         f"the source or tokenizer changed. Delete {directory} to prepare the split again.")


# --------------------------------------------------------------------------------------
# Both splits
# --------------------------------------------------------------------------------------
def plan_val(settings: PrepSettings, src: ResolvedSource) -> SplitPlan:
    n = len(src.files)
    if settings.val_split == "last_file":
        if n < 2:
            raise ShardError(f"val_split: last_file needs at least 2 data files; {settings.source.path!r} has {n}")
        return SplitPlan("val", Position(n - 1, 0, 0), n, settings.val_tokens,
                         f"the first documents of the last data file ({file_label(src.files[-1])}), in order, "
                         f"until {settings.val_tokens:,} tokens (the last one cut there); training never reads "
                         "this file (the authors' split)")
    return SplitPlan("val", Position(0, 0, 0), n, settings.val_tokens,
                     f"the first documents of the corpus in file order, until {settings.val_tokens:,} tokens "
                     "(the last one cut there); training starts at the next whole document")


def plan_train(settings: PrepSettings, src: ResolvedSource, val_end: Position) -> SplitPlan:
    n = len(src.files)
    if settings.val_split == "last_file":
        return SplitPlan("train", Position(0, 0, 0), n - 1, settings.train_tokens,
                         f"the documents of data files 1-{n - 1} of {n} in order (all but the last, which holds "
                         f"the validation set), until {settings.train_tokens:,} tokens")
    start = val_end.next_document()
    return SplitPlan("train", start, n, settings.train_tokens,
                     f"the documents after the validation set's last one, from file {start.file} row {start.row} "
                     f"on, in file order, until {settings.train_tokens:,} tokens")


def prepare(settings: PrepSettings, tokenizer: str, out: str | Path, workers: int = 0, log=print) -> dict:
    """Prepare ``<out>/val`` then ``<out>/train``; returns a summary with throughput and peak memory."""
    from mor.data.tokenizer import load_tokenizer

    out = Path(out)
    workers = workers or available_cpus()
    tok = load_tokenizer(tokenizer)
    src = resolve(settings.source)
    log(f"source {settings.source.path} ({settings.source.name}): {len(src.files)} {src.builder} file(s), "
        f"revision {src.revision or settings.source.revision}; tokenizer {tokenizer} (vocab {tok.vocab_size})")
    t0 = time.perf_counter()
    val = prepare_split(plan_val(settings, src), out / "val", settings, src, tok, tokenizer, workers, log)
    train = prepare_split(plan_train(settings, src, Position.from_dict(val["end"])), out / "train", settings, src,
                          tok, tokenizer, workers, log)
    seconds = time.perf_counter() - t0
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux reports KiB)
    peak_workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    summary = {"out": str(out), "train_tokens": train["tokens"], "val_tokens": val["tokens"],
               "train_shards": len(train["shards"]), "val_shards": len(val["shards"]), "workers": workers,
               "seconds": seconds, "peak_rss_mib": peak_self, "peak_worker_rss_mib": peak_workers}
    log(f"prepared {out}: train {train['tokens']:,} tokens in {len(train['shards'])} shard(s), val "
        f"{val['tokens']:,}; {seconds:.1f}s with {workers} worker(s); peak RSS {peak_self:.0f} MiB "
        f"(largest worker {peak_workers:.0f} MiB)")
    return summary


def prepare_job(settings: str, tokenizer: str, out: str, workers: int = 0) -> dict:
    """The ``data`` job (``mor.jobs``): ``prepare`` from a settings file's path, so a Slurm job
    pickles paths only. A requeued job resumes at the first unfinished shard."""
    return prepare(load_settings(settings), tokenizer, out, workers)


def summary(r: dict) -> str:
    """The one line a finished data job prints."""
    return (f"prepared {r['out']}: train {r['train_tokens']:,} tokens in {r['train_shards']} shard(s), val "
            f"{r['val_tokens']:,}; {r['seconds']:.0f}s on {r['workers']} worker(s), peak RSS {r['peak_rss_mib']:.0f} MiB")
