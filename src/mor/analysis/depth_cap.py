"""Test-time scaling (§ 5.3, Fig. 5c): validation NLL with the recursion depth capped.

For a cap d in 1..Nr the model runs recursions 1..d only (``model(x, max_depth=d)``): the
routing of those recursions is the model's own, the tokens it would have sent deeper stop
at d, and the unshared suffix layers and the head follow as usual. At d = Nr this is the
eval job's ``val_nll`` on the same windows. ``val_nll_causal`` does the same with the causal
routing decoding uses (``full_forward_causal(..., max_depth=d)``); for Vanilla and Recursive
models the two are one computation.
"""

from __future__ import annotations

import numpy as np
import torch


def validation_windows(tokens: np.ndarray, seq_len: int, max_tokens: int) -> np.ndarray:
    """(n, seq_len + 1) int64: the eval job's windows (consecutive, non-overlapping)."""
    n = min(len(tokens) // (seq_len + 1), max(1, max_tokens // seq_len))
    if n < 1:
        raise ValueError(f"validation split of {len(tokens)} tokens is shorter than one window of {seq_len + 1}")
    return np.asarray(tokens[: n * (seq_len + 1)], dtype=np.int64).reshape(n, seq_len + 1)


def _nll_sum(logits: torch.Tensor, y: torch.Tensor) -> float:
    logp = torch.log_softmax(logits.float(), dim=-1)  # (b, T, V)
    return -logp.gather(-1, y.unsqueeze(-1)).sum().item()


@torch.no_grad()
def capped_nll(model, windows: np.ndarray, batch: int, device, causal: bool | None = None) -> dict:
    """{'max_depth': [1..Nr], 'val_nll': [...], 'val_nll_causal': [...], 'tokens': n} over ``windows``.

    ``causal`` (default: for routed models) also scores the causal routing; otherwise
    ``val_nll_causal`` repeats ``val_nll``.
    """
    from mor.model.decode import full_forward_causal

    model.eval()
    nr = len(model.plan.recursions)
    routed = bool(getattr(model, "routers", None))
    causal = routed if causal is None else causal
    tf, cz = np.zeros(nr), np.zeros(nr)
    count = 0
    for i in range(0, len(windows), batch):
        chunk = torch.from_numpy(np.asarray(windows[i : i + batch])).to(device)  # (b, T+1)
        x, y = chunk[:, :-1], chunk[:, 1:]
        count += y.numel()
        for d in range(1, nr + 1):
            tf[d - 1] += _nll_sum(model(x, max_depth=d).logits, y)
            if causal:
                cz[d - 1] += _nll_sum(full_forward_causal(model, x, max_depth=d).logits, y)
    tf /= count
    cz = cz / count if causal else tf.copy()
    return {"max_depth": list(range(1, nr + 1)), "val_nll": tf.tolist(), "val_nll_causal": cz.tolist(), "tokens": count}
