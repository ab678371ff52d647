"""Where each data artifact of a data config lives (Snakemake rules and jobs agree on it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mor.config import DataConfig


@dataclass(frozen=True)
class DataPaths:
    tokenizer: str  # a tokenizer.json path, or a hub name for the cluster path
    train_tokens: Path
    val_tokens: Path


def local_tokenizer(name: str) -> bool:
    """A tokenizer that is a local file: a trained ``bpe-<vocab>``, or a named start point's own
    (``smollm2-135m-instruct``: built from its GGUF file, mor.checkpoints.gguf); never the hub's."""
    from mor.checkpoints.gguf import START_POINTS

    return name.startswith("bpe-") or name in START_POINTS


def data_paths(cfg: DataConfig, root: Path = Path("data")) -> DataPaths:
    if cfg.source == "django-docs":
        if not local_tokenizer(cfg.tokenizer):
            raise ValueError(f"data.source=django-docs needs a local tokenizer 'bpe-<vocab>' or a start "
                             f"point's, got {cfg.tokenizer!r}")
        tag = cfg.tokenizer
        return DataPaths(str(root / "tokenizer" / f"{tag}.json"), root / "tokens" / f"train-{tag}.npy",
                         root / "tokens" / f"val-{tag}.npy")
    folder = fineweb_dir(cfg.tokenizer, root)  # sharded (mor.data.shards); the manifests are the rule's outputs
    return DataPaths(cfg.tokenizer, folder / "train" / "manifest.json", folder / "val" / "manifest.json")


def fineweb_dir(tokenizer: str, root: Path = Path("data")) -> Path:
    """``<root>/tokens/fineweb-edu-<tokenizer with / as -->``: one prepared corpus per tokenizer."""
    return Path(root) / "tokens" / f"fineweb-edu-{tokenizer.replace('/', '--')}"
