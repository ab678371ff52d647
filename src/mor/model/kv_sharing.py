"""KV strategies in training: recursion-wise caching, recursive KV sharing (and its dagger
variant), applied to one effective layer on the tokens it is given (no cache).

Who computes the keys/values an effective layer attends over is one map,
``tying.kv_producers`` (held by the model as ``model.kv_producers``): a layer either
produces its own KV or reads the KV of an earlier "producer" layer.

    recursion_wise  every layer its own KV; in MoR a recursion's layers see (and cache)
                    only the tokens routed to that recursion.
    shared          recursion r > 1 reads the KV that the same layer position of recursion
                    1 computed for all its tokens; only the active tokens' queries are
                    computed (mask: causal over original positions).
    shared_dagger   as shared for the inactive positions, fresh KV for the active ones
                    (App. H.2, the dagger rows of Table 15).

The inference-time cache that decoding fills under the same strategies is
``mor.model.kv_cache`` (one KV layout for both: ``kv_layout.cache_layout``).
"""

from __future__ import annotations

import torch


def causal_kv_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(B, 1, Tq, S) bool: a query at position p sees every key at a position <= p."""
    return (k_pos.unsqueeze(1) <= q_pos.unsqueeze(2)).unsqueeze(1)  # (B, 1, Tq, S)


def run_kv_layer(model, e: int, layer_id: int, x: torch.Tensor, positions: torch.Tensor, recursion, store: dict,
                 valid: torch.Tensor | None = None):
    """Apply effective layer ``e`` (unique layer ``layer_id``) to x under ``model.cfg.kv``.

    x: (B, Tq, C) the tokens this layer runs on, ascending original ``positions`` (B, Tq).
    ``store`` maps a producer's effective index to its (k, v, positions); a producer
    fills it, a consumer reads it. The tokens a consumer runs on are a subset of its
    producer's (hierarchical routing), so only their queries are computed: a 'shared'
    consumer projects no keys/values at all.

    ``valid`` (B, Tq) bool: x is a packed block (token-choice) whose rows past each
    sequence's running tokens are padding (distinct other tokens, in no particular order).
    A consumer then always attends under the explicit causal mask, and a dagger consumer
    refreshes only the valid rows' entries.
    """
    p = model.kv_producers[e]
    if p == e:
        if e not in model.kv_sources:  # nobody reads this layer's KV: plain layer call
            return model.run_layer(layer_id, x, positions, recursion)
        k, v = model.layer_kv(layer_id, x, positions, recursion)  # (B, Hkv, Tq, hd) each
        store[e] = (k, v, positions)
        return model.run_layer(layer_id, x, positions, recursion, kv=(k, v))
    k, v, k_pos = store[p]  # (B, Hkv, S, hd), (B, S)
    if model.cfg.kv == "shared_dagger":
        fk, fv = model.layer_kv(layer_id, x, positions, recursion)  # (B, Hkv, Tq, hd) fresh
        slot = torch.searchsorted(k_pos.contiguous(), positions.contiguous())  # (B, Tq) entry of each query token
        sel = slot[:, None, :, None].expand_as(fk)  # (B, Hkv, Tq, hd)
        if valid is not None:  # padding rows keep their producer entry
            keep = valid[:, None, :, None]  # (B, 1, Tq, 1)
            fk, fv = torch.where(keep, fk, k.gather(2, sel)), torch.where(keep, fv, v.gather(2, sel))
        k, v = k.scatter(2, sel, fk), v.scatter(2, sel, fv)  # (B, Hkv, S, hd) active entries fresh
    # same token count => same tokens (subset), so the plain causal square applies
    square = valid is None and x.shape[1] == k_pos.shape[1]
    mask = None if square else causal_kv_mask(positions, k_pos)  # (B, 1, Tq, S)
    return model.run_layer(layer_id, x, positions, recursion, kv=(k, v), attn_mask=mask)
