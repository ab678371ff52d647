"""The routing arithmetic: what fraction of tokens each recursion keeps, and how many that is.

Torch-free and pure: the model's routers, the KV layout, FLOPs, the memory model and the
exporter all size a recursion with these two functions.
"""

from __future__ import annotations

import math


def capacities(num_recursions: int, explicit: tuple[float, ...] = ()) -> list[float]:
    """Fraction of tokens kept at each recursion: hierarchical Nr/Nr, (Nr-1)/Nr, ..., 1/Nr."""
    if explicit:
        return list(explicit)
    return [(num_recursions - r) / num_recursions for r in range(num_recursions)]


def tokens_kept(seq_len: int, fraction: float) -> int:
    """Top-k size for one sequence: at least one token, never more than the sequence."""
    return max(1, min(seq_len, math.ceil(seq_len * fraction - 1e-9)))
