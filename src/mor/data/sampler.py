"""Training batches drawn from a token array (a flat .npy, or shards read as one), addressed by
(step, micro-batch, rank).

Each batch is a pure function of the seed and its address, so resuming at step s needs
nothing but s ("data position" = optimizer steps done), and any number of ranks draw
disjoint, reproducible slices of the same global batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mor.data.shards import ShardedTokens, is_sharded


def load_tokens(path: str | Path, checksum: bool = True):
    """Memory-map a token file: a flat .npy, or a sharded set (``manifest.json`` or its folder,
    see ``mor.data.shards``: one logical 1-D array, each shard checked against its size and
    sha256 unless ``checksum`` is false). A clear error names a missing or corrupt file."""
    if is_sharded(path):
        return ShardedTokens(path, checksum=checksum)
    try:
        arr = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise FileNotFoundError(f"token file {path} not found; run the data rules first (snakemake data)") from None
    except ValueError as e:
        raise ValueError(f"token file {path} is corrupt or not a .npy array: {e}") from None
    if arr.ndim != 1:
        raise ValueError(f"token file {path}: expected a 1-D array, got shape {arr.shape}")
    return arr


class TokenSampler:
    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int):
        if len(tokens) < seq_len + 2:
            raise ValueError(f"{len(tokens)} tokens cannot fill one sequence of {seq_len}")
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed

    def batch(self, step: int, micro: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (size, seq_len) int64, for one micro-batch of one rank."""
        rng = np.random.default_rng([self.seed, step, micro, rank])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=size)  # (size,)
        windows = np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)  # (size, T+1)
        x = torch.from_numpy(windows[:, :-1])
        y = torch.from_numpy(windows[:, 1:])
        return x, y
