"""Key / value states across depths of a Recursive model (App. H.1, Figs. 7 and 8).

The states are read from the inference KV cache after a prefill (``mor.model.decode``): one
slot per effective layer, keys rotated by RoPE. Rotation preserves a key's norm, and the
keys of one token at two layers are rotated by the same angles, so magnitudes and cosine
similarities are those of the un-rotated projections too.

    magnitude(states)        (L, T): mean over sequences and KV heads of ||state||_2
    pairwise_cosine(states)  (L, L): mean over sequences, heads and tokens of cos(s_i, s_j)

with states (L, B, H, T, hd): L effective layers (depths), B sequences, H KV heads.
"""

from __future__ import annotations

import numpy as np


def magnitude(states: np.ndarray) -> np.ndarray:
    """(L, B, H, T, hd) -> (L, T) mean L2 norm per depth and position."""
    s = np.asarray(states, dtype=np.float64)
    if s.ndim != 5:
        raise ValueError(f"states must be (L, B, H, T, hd), got shape {s.shape}")
    return np.linalg.norm(s, axis=-1).mean(axis=(1, 2))


def pairwise_cosine(states: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """(L, B, H, T, hd) -> (L, L): cosine similarity of the same token's state at two depths,
    per head, averaged over sequences, heads and tokens."""
    s = np.asarray(states, dtype=np.float64)
    if s.ndim != 5:
        raise ValueError(f"states must be (L, B, H, T, hd), got shape {s.shape}")
    unit = s / np.maximum(np.linalg.norm(s, axis=-1, keepdims=True), eps)  # (L, B, H, T, hd)
    n = unit.shape[1] * unit.shape[2] * unit.shape[3]
    flat = unit.reshape(unit.shape[0], n, unit.shape[4])  # (L, N, hd)
    return np.einsum("lnd,mnd->lm", flat, flat) / n


def kv_states(model, idx) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values of every effective layer for token ids ``idx`` (B, T): (L, B, Hkv, T, hd) each.

    Needs a model whose every layer computes its own KV over every token: Vanilla or
    Recursive with recursion-wise caching (MoR layers see only their routed tokens; a
    KV-sharing layer holds its producer's states)."""
    import torch

    from mor.model.decode import prefill

    if getattr(model, "routers", None):
        raise ValueError("kv_states needs a Vanilla or Recursive model: MoR recursions cache only their routed tokens")
    model.eval()
    with torch.no_grad():
        cache, _ = prefill(model, idx)
    T = idx.shape[1]
    ks, vs = [], []
    for e, spec in enumerate(cache.specs):
        if spec.kind != "own":
            raise ValueError(f"effective layer {e} reads the KV of layer {spec.source} (model.kv={model.cfg.kv!r}); "
                             "kv_states needs model.kv='recursion_wise'")
        slot = cache.slots[e]
        ks.append(slot.k[:, :, :T].float().cpu().numpy())
        vs.append(slot.v[:, :, :T].float().cpu().numpy())
    return np.stack(ks), np.stack(vs)


def kv_statistics(keys: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays Figs. 7 and 8 draw: magnitudes (L, T) and cosine matrices (L, L) of both."""
    return {"key_magnitude": magnitude(keys), "value_magnitude": magnitude(values),
            "key_cosine": pairwise_cosine(keys), "value_cosine": pairwise_cosine(values)}


def depth_labels(plan) -> list[str]:
    """One label per effective layer: 'L<unique id>' for unshared, 'r<recursion>.L<id>' inside recursions."""
    labels = [f"L{i}" for i in plan.prefix]
    for r, rec in enumerate(plan.recursions):
        labels += [f"r{r + 1}.L{i}" for i in rec]
    return labels + [f"L{i}" for i in plan.suffix]
