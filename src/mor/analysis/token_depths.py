"""Tokens and the recursion depth they receive (Table 17, Fig. 1 right).

Input: a run's ``sample_token_ids`` / ``sample_token_depths`` (the eval job keeps those of
the first validation windows) and a decoder (the run's tokenizer).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence


def token_pieces(token_ids: Sequence[int], depths: Sequence[int], decode: Callable[[list[int]], str]) -> list[tuple[str, int]]:
    """[(text of each token, its depth)], in order."""
    if len(token_ids) != len(depths):
        raise ValueError(f"{len(token_ids)} token ids but {len(depths)} depths")
    return [(decode([int(t)]), int(d)) for t, d in zip(token_ids, depths)]


def group_by_depth(token_ids: Sequence[int], depths: Sequence[int], decode: Callable[[list[int]], str],
                   num_recursions: int) -> list[dict]:
    """One entry per depth 1..Nr: {'depth', 'n' (tokens at that depth), 'share' (of all tokens),
    'tokens': [(text, count, fraction of that token's occurrences that got this depth)], most
    frequent first (ties: by text)}."""
    pieces = token_pieces(token_ids, depths, decode)
    if any(not 1 <= d <= num_recursions for _, d in pieces):
        raise ValueError(f"depths must lie in 1..{num_recursions}, got {sorted({d for _, d in pieces})}")
    total = Counter(t for t, _ in pieces)
    out = []
    for d in range(1, num_recursions + 1):
        at = Counter(t for t, dd in pieces if dd == d)
        ranked = sorted(at.items(), key=lambda kv: (-kv[1], kv[0]))
        out.append({"depth": d, "n": sum(at.values()), "share": sum(at.values()) / len(pieces) if pieces else 0.0,
                    "tokens": [(t, c, c / total[t]) for t, c in ranked]})
    return out


def layout(pieces: Sequence[tuple[str, int]], width: int) -> list[tuple[int, int, str, int]]:
    """Place token texts on lines of at most ``width`` characters (monospace), breaking at a
    newline inside a token and before a token that would overflow. Returns (line, column,
    text, depth) per printed piece; a token split by a newline gives one piece per line part,
    and empty parts are dropped."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    out, line, col = [], 0, 0
    for text, depth in pieces:
        parts = text.replace("\r", "").split("\n")
        for i, part in enumerate(parts):
            if i > 0:
                line, col = line + 1, 0
            if not part:
                continue
            if col and col + len(part) > width:
                line, col = line + 1, 0
                part = part.lstrip(" ") or part
            out.append((line, col, part, depth))
            col += len(part)
    return out
