"""Whole tensors from FSDP2 shards and back, for code that must see a parameter whole.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) a parameter outside its unit's forward
is a DTensor holding this rank's shard. Checkpointing (``mor.train.parallel``) and the
loss-free balancing bias update (``mor.model.router``) gather it, work on the whole tensor,
and cut this rank's shard again. Plain tensors (one process, DDP) pass through unchanged.
"""

from __future__ import annotations

import torch


def gather_full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (an all-gather: every rank must call it)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` (the same on every rank) laid out like ``like``: its shard of a DTensor, cut
    locally without communication; ``full`` itself, on like's device and dtype, otherwise."""
    full = full.to(device=like.device, dtype=like.dtype)
    if not hasattr(like, "device_mesh"):
        return full
    from torch.distributed.tensor import distribute_tensor  # noqa: PLC0415 (only under FSDP)

    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
