"""Shared fixtures: the real embedded corpus (built once per machine) and tiny configs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from mor.config import ModelConfig, RunConfig, TrainConfig  # noqa: E402

DATA = Path(os.environ.get("MOR_TEST_DATA", REPO / "data"))
VOCAB = 4096


def ensure_data(root: Path = DATA) -> Path:
    """The same files the Snakemake data rules make (corpus, BPE, token arrays), built if absent."""
    from mor.data.corpus import build_corpus
    from mor.data.tokenizer import train_bpe
    from mor.data.tokens import encode_corpus

    corpus = root / "corpus"
    if not (corpus / "val.txt").exists():
        build_corpus(corpus, cache_dir=root / "cache")
    tok = root / "tokenizer" / f"bpe-{VOCAB}.json"
    if not tok.exists():
        train_bpe(corpus / "train.txt", VOCAB, tok)
    for split in ("train", "val"):
        out = root / "tokens" / f"{split}-bpe-{VOCAB}.npy"
        if not out.exists():
            encode_corpus(corpus / f"{split}.txt", tok, out)
    return root


@pytest.fixture(scope="session")
def data_root() -> Path:
    return ensure_data()


def tiny_run(variant="vanilla", tying="middle_cycle", nr=1, steps=8, seq_len=32, batch=4, **model_kw) -> RunConfig:
    return RunConfig(
        grid="test",
        model=ModelConfig(scale="tiny", variant=variant, tying=tying, num_recursions=nr, **model_kw),
        train=TrainConfig(tokens=steps * batch * seq_len, seq_len=seq_len, global_batch=batch, micro_batch=batch,
                          checkpoint_every=4, lr=3e-3),
    )
