"""KV bookkeeping of the engine: which physical cache blocks hold whose keys and values.

The cache (cache.py) is one pool of ``num_blocks`` blocks of ``block_size`` token entries,
shared by every layer that stores KV (``kv_layout.cache_layout``'s 'own' and 'dagger'
layers; 'shared' layers read their producer's). A sequence holds, per storing layer, a list
of blocks (its block table row) and a length (entries written). A block is taken from the
free list when a token routed into that layer's recursion needs an entry past the last
block, and every block of a sequence goes back when it finishes or is preempted. So the
memory in use follows the routers: recursion-wise caching holds the tokens each recursion
really ran, shared KV recursion 1's only.

All of it lives on the host (numpy), mirrored by the scheduler's own knowledge of which
token runs where: a pass's write slots and read tables are computed here before the pass
and sent to the device in one copy, so the device never waits for the host inside a pass.

    table   (S + 1, E, MB) int32  block ids per sequence slot s and storing layer column c
                                  (row S: the padding row, pointing at the trash block)
    length  (S + 1, E) int64      entries written
    slot    block * block_size + offset: a flat index into the pool's entries

Block ``num_blocks`` is the trash block: padded rows write there and read one entry of it.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class OutOfBlocks(Exception):
    """Not enough free blocks for a pass (the engine waits or preempts)."""


class BlockManager:
    def __init__(self, specs, num_blocks: int, block_size: int, max_seqs: int, max_len: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"the paged cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.specs, self.bs = specs, block_size
        self.num_blocks, self.trash = num_blocks, num_blocks
        self.store = [e for e, s in enumerate(specs) if s.kind != "shared"]  # storing layers
        E = len(self.store)
        self.col = np.full(len(specs), -1, dtype=np.int64)  # effective layer -> its storing column
        self.col[self.store] = np.arange(E)
        # where layer e reads: its own column, or (shared) its producer's
        self.read_col = np.array([self.col[e if s.kind != "shared" else s.source] for e, s in enumerate(specs)])
        mirrors: dict[int, list[int]] = {}
        for e, s in enumerate(specs):
            if s.kind == "dagger":
                mirrors.setdefault(s.source, []).append(e)
        self.mirrors = {e: [int(self.col[d]) for d in ds] for e, ds in mirrors.items()}
        self.kind = np.array([("own", "shared", "dagger").index(s.kind) for s in specs])
        width = max((len(v) for v in self.mirrors.values()), default=0)
        self.mirror_cols = np.full((len(specs), max(width, 1)), -1, dtype=np.int64)  # (E_eff, W - 1)
        for e, cs in self.mirrors.items():
            self.mirror_cols[e, : len(cs)] = cs
        self.n_mirrors = (self.mirror_cols >= 0).sum(1)
        self.max_blocks = math.ceil(max_len / block_size)
        self.max_seqs = max_seqs
        self.table = np.full((max_seqs + 1, E, self.max_blocks), self.trash, dtype=np.int32)
        self.length = np.zeros((max_seqs + 1, E), dtype=np.int64)
        self.length[max_seqs] = 1  # the padding row reads one (trash) entry: never an empty softmax
        self.nblocks = np.zeros((max_seqs + 1, E), dtype=np.int64)
        self.free: deque[int] = deque(range(num_blocks))
        self.peak = 0

    # ------------------------------------------------------------------ accounting
    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free)

    def needed(self, writes: list[tuple[int, list[int]]]) -> int:
        """New blocks that appending one entry at each (slot, columns) would take: an entry
        past a column's last block takes one (asked before every pass: one numpy gather)."""
        if not writes:
            return 0
        counts = [len(cols) for _, cols in writes]
        ss = np.repeat(np.fromiter((s for s, _ in writes), dtype=np.int64, count=len(writes)), counts)
        cc = np.fromiter((c for _, cols in writes for c in cols), dtype=np.int64, count=int(sum(counts)))
        return int(np.count_nonzero(self.length[ss, cc] == self.nblocks[ss, cc] * self.bs))

    def worst_case(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` fed tokens takes if every token reaches every layer."""
        return len(self.store) * math.ceil(tokens / self.bs)

    def blocks_of(self, counts: dict[int, int]) -> int:
        """Blocks that hold ``counts`` entries per storing column."""
        return sum(math.ceil(n / self.bs) for n in counts.values())

    # ------------------------------------------------------------------ writes
    def _append(self, s: int, c: int) -> int:
        n = int(self.length[s, c])
        if n == self.nblocks[s, c] * self.bs:
            if not self.free:
                raise OutOfBlocks(f"sequence slot {s}")
            self.table[s, c, self.nblocks[s, c]] = self.free.popleft()
            self.nblocks[s, c] += 1
            self.peak = max(self.peak, self.used)
        self.length[s, c] = n + 1
        return int(self.table[s, c, n // self.bs]) * self.bs + n % self.bs

    def _append_many(self, seqs: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Append one entry at (seqs[i], cols[i]) for every i (pairs distinct): flat slots."""
        n = self.length[seqs, cols]
        for i in np.flatnonzero(n == self.nblocks[seqs, cols] * self.bs):  # a new block (1 in bs appends)
            s, c = seqs[i], cols[i]
            if not self.free:
                raise OutOfBlocks(f"sequence slot {s}")
            self.table[s, c, self.nblocks[s, c]] = self.free.popleft()
            self.nblocks[s, c] += 1
        self.peak = max(self.peak, self.used)
        self.length[seqs, cols] = n + 1
        return self.table[seqs, cols, n // self.bs].astype(np.int64) * self.bs + n % self.bs

    def plan_layer(self, seqs: list[int], layers: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row i (sequence slot seqs[i]) runs effective layer layers[i] on one token: take its
        entries and say where it reads. Returns write slots (W, n) (-1: no write; row 0 the
        layer's own entry or a dagger's refreshed one, rows 1.. the dagger mirrors of a
        producer), read columns (n,) and read lengths (n,) after the writes."""
        s, e = np.asarray(seqs, dtype=np.int64), np.asarray(layers, dtype=np.int64)
        kind = self.kind[e]  # 0 own, 1 shared, 2 dagger
        W = 1 + int(self.n_mirrors[e].max(initial=0))
        out = np.full((W, len(seqs)), -1, dtype=np.int64)
        own = np.flatnonzero(kind == 0)
        if own.size:
            out[0, own] = self._append_many(s[own], self.col[e[own]])
            for w in range(1, W):
                mc = self.mirror_cols[e[own], w - 1]
                m = own[mc >= 0]
                if m.size:
                    out[w, m] = self._append_many(s[m], mc[mc >= 0])
        dag = np.flatnonzero(kind == 2)
        if dag.size:  # the token's entry, mirrored when its producer ran
            c = self.col[e[dag]]
            n = self.length[s[dag], c] - 1
            out[0, dag] = self.table[s[dag], c, n // self.bs].astype(np.int64) * self.bs + n % self.bs
        cols = self.read_col[e]
        return out, cols, self.length[s, cols]

    def fill(self, s: int, c: int, n: int) -> np.ndarray:
        """Take entries 0..n-1 of column c of a new sequence (a prefilled prompt): their slots."""
        return np.array([self._append(s, c) for _ in range(n)], dtype=np.int64)

    def release(self, s: int) -> None:
        """Give back every block of sequence slot s."""
        for c in range(len(self.store)):
            k = int(self.nblocks[s, c])
            self.free.extend(int(b) for b in self.table[s, c, :k])
        self.table[s] = self.trash
        self.length[s] = 0
        self.nblocks[s] = 0

    def in_use(self) -> int:
        """Blocks the live sequences' entries need (== used: nothing is held beyond them)."""
        return int(np.ceil(self.length[: self.max_seqs] / self.bs).sum())
