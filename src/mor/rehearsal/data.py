"""Synthetic token files where a run's real data is absent, in the tokenizer's vocabulary.

A rehearsal reads tokens through the job's own loader (``mor.data.sampler.load_tokens``): a
sharded corpus (``mor.data.shards``' manifest format, the cluster's FineWeb-Edu path) or a flat
``.npy`` (the CPU scales). The tokens are uniform random ids below the vocabulary size; only
their shapes and dtype matter on fake tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mor.atomic import sha256_file
from mor.data.paths import DataPaths, data_paths
from mor.data.shards import FORMAT, MANIFEST, shard_name, token_dtype

TOKENS = 1 << 20  # per split: room for any batch a sampler draws (it wraps windows into the file)


def write_split(directory: Path, tokenizer: str, vocab: int, tokens: int = TOKENS, seed: int = 0) -> Path:
    """One shard and its manifest under ``directory``, as the data job writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(vocab)
    ids = np.random.default_rng(seed).integers(0, vocab, tokens).astype(dtype)  # (tokens,)
    shard = directory / shard_name(0)
    np.save(shard, ids, allow_pickle=False)  # shard names end in .npy: saved under that name
    entry = {"file": shard.name, "tokens": tokens, "bytes": shard.stat().st_size, "sha256": sha256_file(shard),
             "start": {"file": 0, "row": 0, "offset": 0}, "end": {"file": 0, "row": 1, "offset": 0}}
    manifest = {"format": FORMAT, "split": directory.name, "dtype": dtype.name,
                "tokenizer": {"name": tokenizer, "vocab_size": vocab, "eos_id": 0},
                "source": "synthetic (mor.rehearsal)", "tokens": tokens, "shards": [entry],
                "documents": "uniform random ids", "eos_after_each_document": True}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return directory / MANIFEST


def ensure_data(run, data_root: Path, vocab: int) -> DataPaths:
    """The run's token files under ``data_root`` (``mor.data.paths.data_paths``), written
    synthetically where missing; an existing file is left as it is."""
    paths = data_paths(run.data, Path(data_root))
    for split in (paths.train_tokens, paths.val_tokens):
        split = Path(split)
        if split.exists():
            continue
        if split.suffix == ".npy":
            split.parent.mkdir(parents=True, exist_ok=True)
            np.save(split, np.random.default_rng(0).integers(0, vocab, TOKENS).astype(token_dtype(vocab)))
        else:
            write_split(split.parent, str(paths.tokenizer), vocab)
    return paths
