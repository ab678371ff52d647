"""Cluster data path: stream FineWeb-Edu (dedup, SmolLM corpus) and tokenize it into the same
flat .npy format as the local corpus, so training has one code path.

Needs network access and the ``datasets`` + ``transformers`` packages (the cluster
environment in environment.yml); never used by the local profile or the tests.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

DATASET = "HuggingFaceTB/smollm-corpus"
SUBSET = "fineweb-edu-dedup"


def stream_tokens(tokenizer_name: str, out_dir: Path, train_tokens: int, val_tokens: int, seed: int = 0) -> None:
    """Write out_dir/val.npy (first ``val_tokens``) and out_dir/train.npy (next ``train_tokens``)."""
    from datasets import load_dataset  # cluster extra

    from mor.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_name)
    ds = load_dataset(DATASET, SUBSET, split="train", streaming=True).shuffle(seed=seed, buffer_size=10_000)
    dtype = np.uint16 if tok.vocab_size <= 65536 else np.uint32
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = [("val", val_tokens), ("train", train_tokens)]
    it = iter(ds)
    for split, n in targets:
        buf = np.empty(n, dtype=dtype)
        filled = 0
        with tqdm(total=n, unit="tok", desc=f"fineweb-edu {split}") as bar:
            while filled < n:
                ids = tok.encode(next(it)["text"]) + [tok.eos_id]
                take = min(len(ids), n - filled)
                buf[filled : filled + take] = ids[:take]
                filled += take
                bar.update(take)
        tmp = out_dir / f"{split}.tmp.npy"
        np.save(tmp, buf)
        os.replace(tmp, out_dir / f"{split}.npy")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train-tokens", type=int, required=True)
    ap.add_argument("--val-tokens", type=int, required=True)
    a = ap.parse_args(argv)
    stream_tokens(a.tokenizer, a.out, a.train_tokens, a.val_tokens)


if __name__ == "__main__":
    main()
