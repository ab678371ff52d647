"""The fixed shapes the engine's passes run at: row buckets (rows padded up to a few sizes)
and block-table widths, so a pass can be compiled or captured once per shape.
"""

from __future__ import annotations

import torch


def row_buckets(batch: int, buckets=None, device="cuda", compiled: bool = False) -> tuple[int, ...]:
    """The row counts padded passes run at: ``buckets`` checked (ascending positive integers,
    the largest at least the batch, since no pass has more rows), or by default per device:

    GPU   nano-vllm's capture sizes 1, 2, 4, 8, then every 16, and the batch itself: a
          decoding pass reads every weight whatever its rows, so a padded row costs little,
          and every size is a graph captured (and held in the pool) before the clock
    CPU   every row count up to the batch (no padding): a padded row costs its compute, and
          there is no capture for a shape to amortise (the static path's shapes still run
          once each in the warm-up); ``compiled`` (torch.compile: a compilation per shape)
          takes the GPU's few sizes

    ``(batch,)`` runs every pass at the full batch: one row shape per pass kind, and on any
    device a pass that costs the same whatever rows are live, as a launch-bound GPU pass does."""
    if buckets is None:
        if torch.device(device).type != "cuda" and not compiled:
            return tuple(range(1, max(1, batch) + 1))
        return tuple(sorted({min(x, batch) for x in [1, 2, 4, 8, *range(16, batch + 1, 16)]} | {max(1, batch)}))
    b = tuple(int(x) for x in buckets)
    if not b or any(x < 1 for x in b) or list(b) != sorted(set(b)):
        raise ValueError(f"engine buckets must be ascending positive row counts, got {buckets!r}")
    if b[-1] < batch:
        raise ValueError(f"engine buckets {b} stop below the batch {batch}: a full pass would have no shape")
    return b


def table_widths(max_blocks: int) -> tuple[int, ...]:
    """The block-table widths static passes run at: powers of two below ``max_blocks`` and
    ``max_blocks`` itself. A pass gathers the narrowest that holds its longest row, so it
    reads less than twice its rows' context, whatever ``max_len`` allows."""
    return tuple(sorted({min(1 << k, max_blocks) for k in range(max(1, max_blocks).bit_length() + 1)}))


def bucket(n: int, batch: int, buckets: tuple[int, ...] | None = None) -> int:
    """The fixed row count a pass of n rows is padded to: the smallest bucket that holds it
    (default buckets: a GPU's, ``row_buckets``)."""
    for b in buckets or row_buckets(batch):
        if b >= n:
            return b
    return n
