"""The tiny end of the real pipeline: the embedded corpus's data files (built once per
machine, the same files the Snakemake data rules make), tiny run configs, and a result row
of a run as the collect job writes it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.paths import REPO
from mor.config import ModelConfig, RunConfig, TrainConfig

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


def tiny_run(variant="vanilla", tying="middle_cycle", nr=1, steps=8, seq_len=32, batch=4, **model_kw) -> RunConfig:
    return RunConfig(
        grid="test",
        model=ModelConfig(scale="tiny", variant=variant, tying=tying, num_recursions=nr, **model_kw),
        train=TrainConfig(tokens=steps * batch * seq_len, seq_len=seq_len, global_batch=batch, micro_batch=batch,
                          checkpoint_every=4, lr=3e-3),
    )


def tiny_grid_file(path: Path) -> Path:
    """A one-run grid file (a Vanilla at the tiny scale, 4 steps of 4 x 32 tokens) named after ``path``'s stem."""
    path.write_text(f"name: {path.stem}\nruns:\n  - axes: {{model.scale: [135M]}}\n    set: {{model.variant: vanilla}}\n"
                    "modes:\n  local:\n    scale_map: {135M: tiny}\n    set:\n"
                    "      train: {tokens: 512, seq_len: 32, global_batch: 4, micro_batch: 4, checkpoint_every: 2}\n"
                    "      eval: {nll_tokens: 256, batch: 4}\n")
    return path


def _row(run: RunConfig, **metrics):
    m = run.model
    return {"run_id": run.run_id, "grid": run.grid, "config_hash": run.config_hash, "git_commit": "abc123", "mode": "local",
            "scale": m.scale, "paper_scale": run.paper_scale, "seed": 0, "variant": m.variant,
            "tying": None if m.variant == "vanilla" else m.tying, "num_recursions": m.num_recursions,
            "reduced": m.reduced, "n_params": 1000, "unique_layers": 2, "effective_layers": 4,
            "config_json": json.dumps(run.to_dict()), **metrics}
