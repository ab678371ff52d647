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


def tokens_kept(seq_len: int, fraction: float, rounding: str) -> int:
    """Top-k size for one sequence: at least one token, never more than the sequence.

    ``rounding`` (model.router.capacity_rounding): "floor" int(fraction * T), the authors'
    ``max(1, int(capacity_factor * seq_len))`` to the digit (T 32, Nr 3: 21 / 10 tokens);
    "ceil" never below the fraction (22 / 11), a product within 1e-9 above an integer
    counting as that integer."""
    if rounding == "floor":
        return max(1, min(seq_len, int(fraction * seq_len)))
    if rounding == "ceil":
        return max(1, min(seq_len, math.ceil(seq_len * fraction - 1e-9)))
    raise ValueError(f"capacity rounding {rounding!r}; choose 'floor' or 'ceil'")
