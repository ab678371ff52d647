"""Warmup-stable-decay learning-rate schedule (the paper's recipe, PAPER.md 'Training')."""

from __future__ import annotations


def wsd_lr(step: int, total: int, peak: float, warmup_frac: float, decay_frac: float, min_ratio: float = 0.0,
           warmup_steps: int = 0) -> float:
    """Linear warmup to ``peak``, flat, then linear decay to ``min_ratio * peak``.

    ``step`` counts optimizer steps from 0; the last step (total - 1) gets the final value.
    ``warmup_steps`` > 0 fixes the warmup's length in steps instead of ``warmup_frac`` (the
    authors' released runs: 57 steps Vanilla / Recursive, 86 MoR, whatever the budget).
    """
    if total < 1:
        raise ValueError(f"total steps must be >= 1, got {total}")
    warmup = warmup_steps or int(round(total * warmup_frac))
    decay = int(round(total * decay_frac))
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    decay_start = total - decay
    if decay and step >= decay_start:
        progress = (step - decay_start + 1) / decay  # (0, 1]
        return peak * (1 - (1 - min_ratio) * progress)
    return peak
