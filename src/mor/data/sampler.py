"""Training batches drawn from a token array (a flat .npy, or shards read as one).

Each batch is a pure function of the seed and its address, so resuming at step s needs
nothing but s ("data position" = optimizer steps done). How a sequence is addressed is the
run's ``train.data_order`` (mor.config):

* ``sequence`` (default): sequence j of step s (j < train.global_batch) has a window start
  that depends on (seed, s, j) only. A rank takes a contiguous slice of the j's and cuts it
  into micro-batches, so every split of the global batch into ranks x micro-batches trains
  on the same sequences per step: a run stopped on 2 GPUs resumes on 1 (or 8) and trains on
  what an uninterrupted run would have. The starts of a step are drawn in one vectorised call
  from a generator keyed by (seed, s) and indexed by j (``starts``).
* ``rank`` (legacy): the draws of every run before issue 22, keyed by (seed, step, draw,
  rank), ``batch``. A rank draws its sequences in draws of train.micro_batch, so the same
  step on another rank count is another set of sequences; kept to reproduce old runs.
* ``pass`` (issue 55, the cluster mode's): one pass WITHOUT replacement over the pool, cut
  into non-overlapping windows of seq_len + 1 tokens (window w starts at w * seq_len), in
  an order fixed by the seed. Sequence j of step s is the pass's sequence g = s * global_batch
  + j, i.e. window ``permutation(seed, epoch)[g mod windows]`` of epoch g // windows. The
  authors read one sequential pass (``global_shuffling: false``); a seeded permutation keeps
  their "every window at most once" and lets seeds differ in order. Ranks take contiguous
  j's as under "sequence", so they are disjoint; the position in the pass is a function of
  the step (the checkpoint's state), so a resumed run reads on where it stopped. A run longer
  than the pool is refused by the trainer (``check_pass``) unless it states more epochs.
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


DATA_ORDERS = ("sequence", "rank", "pass")  # mor.config.DataOrder (the sampler stays config-free)

# Third key word of a step's generator under data_order "sequence". numpy's SeedSequence
# pads a short key with zeros, so a bare (seed, step) would replay the legacy draw
# (seed, step, 0, 0); no legacy key (seed, step, draw, rank) has a draw index this large.
_SEQUENCE_KEY = 0x53455155454E4345  # "SEQUENCE"
# Third key word of an epoch's permutation under data_order "pass" (another stream than any above).
_PASS_KEY = 0x50415353  # "PASS"


class PoolTooSmall(ValueError):
    """A run under data_order "pass" asks for more windows than its stated epochs over the pool hold."""


def check_pass(sampler: "TokenSampler", steps: int, epochs: int, source: str) -> int:
    """The epochs a run of ``steps`` steps reads under data_order "pass"; ``PoolTooSmall`` when
    that is more than the ``epochs`` it states (train.data_epochs), naming the pool and sizes."""
    need = sampler.epochs_needed(steps)
    if need > epochs:
        want = steps * sampler.global_batch
        raise PoolTooSmall(
            f"train.data_order='pass': {steps} steps x {sampler.global_batch} sequences = {want:,} windows of "
            f"{sampler.seq_len + 1} tokens ({want * sampler.seq_len:,} tokens), but the pool {source} holds "
            f"{sampler.windows:,} windows ({len(sampler.tokens):,} tokens) and train.data_epochs={epochs}: "
            f"prepare a larger pool (workflows/config/fineweb.yaml train_tokens) or state "
            f"train.data_epochs: {need}")
    return need


class TokenSampler:
    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int, global_batch: int = 0,
                 order: str = "sequence"):
        """``global_batch``: sequences per optimizer step (train.global_batch), the range of the
        sequence index j; ``rank_batch`` and ``starts`` need it, the legacy ``batch`` does not."""
        if len(tokens) < seq_len + 2:
            raise ValueError(f"{len(tokens)} tokens cannot fill one sequence of {seq_len}")
        if order not in DATA_ORDERS:
            raise ValueError(f"data order {order!r}; choose one of {list(DATA_ORDERS)}")
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.global_batch, self.order = global_batch, order
        self.high = len(tokens) - seq_len - 1  # window starts lie in [0, high)
        # data_order "pass": non-overlapping windows tokens[w*T : w*T + T + 1], w < windows
        self.windows = (len(tokens) - 1) // seq_len
        self._perm: tuple[int, np.ndarray] | None = None  # (epoch, its permutation): one cached

    # ------------------------------------------------------------------ data_order: pass
    def permutation(self, epoch: int) -> np.ndarray:
        """The window order of ``epoch``: a permutation of range(windows) keyed by (seed, epoch).

        Cached for the epoch in use (int32 when it fits: 4 bytes a window, ~60 MB for the
        cluster pool's ~15.6 M windows of 2,048); a step that straddles two epochs
        recomputes one of them, which happens once per epoch boundary."""
        if self._perm is None or self._perm[0] != epoch:
            perm = np.random.default_rng([self.seed, epoch, _PASS_KEY]).permutation(self.windows)
            self._perm = (epoch, perm.astype(np.int32) if self.windows < 2**31 else perm)
        return self._perm[1]

    def pass_position(self, step: int) -> dict:
        """Where step ``step`` starts in the pass: {"epoch", "position" (windows read in it),
        "windows" (of the pool: a resume on another pool is another order, and is refused)}."""
        g = step * self.global_batch
        return {"epoch": g // self.windows, "position": g % self.windows, "windows": self.windows}

    def epochs_needed(self, steps: int) -> int:
        """Passes over the pool that ``steps`` steps read (at least partly): 1 for a run that fits."""
        return max(1, -(-steps * self.global_batch // self.windows))

    def pass_starts(self, step: int, index: np.ndarray) -> np.ndarray:
        """Window starts of the global sequences ``index`` of ``step`` under data_order "pass"."""
        if self.global_batch < 1:
            raise ValueError("TokenSampler(global_batch=...) is needed to address sequences of a step")
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.global_batch):
            raise IndexError(f"sequence index out of range [0, {self.global_batch}) of step {step}")
        g = step * self.global_batch + index
        epoch, pos = g // self.windows, g % self.windows
        out = np.empty(index.shape, dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self.permutation(int(e))[pos[sel]]
        return out * self.seq_len

    # ------------------------------------------------------------------ data_order: sequence
    def starts(self, step: int, index: np.ndarray) -> np.ndarray:
        """Window starts of the global sequences ``index`` (each < global_batch) of ``step``.

        All global_batch starts of the step come from one generator keyed by (seed, step) and
        sequence j takes the j-th: a pure function of (seed, step, j) that costs one vectorised
        draw per step (a generator per sequence would cost ~30 us each)."""
        if self.global_batch < 1:
            raise ValueError("TokenSampler(global_batch=...) is needed to address sequences of a step")
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.global_batch):
            raise IndexError(f"sequence index out of range [0, {self.global_batch}) of step {step}")
        rng = np.random.default_rng([self.seed, step, _SEQUENCE_KEY])
        return rng.integers(0, self.high, size=self.global_batch)[index]  # (len(index),)

    def sequences(self, step: int, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (len(index), seq_len) int64, of the global sequences ``index``."""
        return self._windows(self.starts(step, index))

    # ------------------------------------------------------------------ data_order: rank (legacy)
    def batch(self, step: int, micro: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The legacy draw (data_order "rank"): (inputs, targets), each (size, seq_len) int64,
        of draw ``micro`` of ``rank``, exactly as every run before issue 22 drew it."""
        rng = np.random.default_rng([self.seed, step, micro, rank])
        return self._windows(rng.integers(0, self.high, size=size))

    # ------------------------------------------------------------------ what the trainer asks for
    def rank_batch(self, step: int, rank: int, world: int, draw: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's sequences of ``step``: (inputs, targets), each (global_batch / world, seq_len).

        Order "sequence": the contiguous j in [rank * per_rank, (rank + 1) * per_rank), so the
        ranks' slices, and any micro-batches cut from them in order, tile 0..global_batch-1.
        Order "pass": the same j's, read from the pass (``pass_starts``).
        Order "rank": the legacy draws (step, d, rank) of ``draw`` sequences, d < per_rank / draw."""
        if self.global_batch < 1 or self.global_batch % world:
            raise ValueError(f"global batch {self.global_batch} cannot be split over {world} rank(s)")
        per_rank = self.global_batch // world
        if self.order == "rank":
            if per_rank % draw:
                raise ValueError(f"per-rank batch {per_rank} is not a multiple of the draw size {draw}")
            xs, ys = zip(*(self.batch(step, d, rank, draw) for d in range(per_rank // draw)))
            return (xs[0], ys[0]) if len(xs) == 1 else (torch.cat(xs), torch.cat(ys))
        index = np.arange(rank * per_rank, (rank + 1) * per_rank)
        if self.order == "pass":
            return self._windows(self.pass_starts(step, index))
        return self.sequences(step, index)

    def _windows(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        windows = np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)  # (n, T+1)
        return torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, 1:])
