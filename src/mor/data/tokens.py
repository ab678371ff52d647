"""Pre-tokenize a corpus split into one flat token array (.npy) for memory-mapped training.

Why: tokenizing once up front makes every training run read identical token
streams, and a flat uint16 array (uint32 only when the vocab needs it) is cheap
to np.load(mmap_mode="r") and slice into fixed-length windows. Documents are
the blocks mor.data.corpus separates by two blank lines; an EOS id follows
every document so the model sees document boundaries.

CLI: ``python -m mor.data.tokens --text data/corpus/train.txt
--tokenizer data/tokenizer/bpe-4096.json --out data/tokens/train-bpe-4096.npy``
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from mor.atomic import atomic_path
from mor.data.corpus import DOC_SEP
from mor.data.tokenizer import load_tokenizer


def read_documents(txt: Path) -> list[str]:
    """Documents of a corpus file: corpus.py separates them by two blank lines
    (paragraphs inside a document by one)."""
    return split_documents(Path(txt).read_text(encoding="utf-8"))


def split_documents(text: str) -> list[str]:
    return [d.strip("\n") for d in text.split(DOC_SEP) if d.strip()]


def encode_corpus(txt: Path, tokenizer_json: Path, out: Path) -> int:
    """Tokenize txt (EOS after each document) into a flat .npy, written atomically."""
    tok = load_tokenizer(tokenizer_json)
    docs = read_documents(txt)
    dtype = np.uint16 if tok.vocab_size <= 65536 else np.uint32
    parts = []
    for i in range(0, len(docs), 64):
        for ids in tok.encode_batch(docs[i:i + 64]):
            parts.append(np.asarray(ids + [tok.eos_id], dtype=dtype))
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp, open(tmp, "wb") as f:  # a file object: np.save adds no suffix
        np.save(f, arr)
    return int(arr.size)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="tokenize a corpus split into a flat .npy")
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    t0 = time.time()
    n = encode_corpus(args.text, args.tokenizer, args.out)
    print(f"{args.text} -> {args.out}: {n:,} tokens ({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
