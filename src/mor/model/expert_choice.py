"""Expert-choice recursion: at recursion r, run the shared layers on the top-k active tokens.

Recursion-wise caching in training: the gathered subsequence is all the attention of
recursion r sees, so keys/values exist (and would be cached) only for tokens routed to r.
Hierarchical filtering: candidates at r are the tokens selected at r-1.
KV sharing (``model.kv`` shared / shared_dagger): the selected tokens of recursion r > 1
compute queries only and attend over the keys/values recursion 1 computed for its tokens
(dagger: with their own entries refreshed), causally by original position
(``kv_sharing.run_kv_layer``).

    H^{r+1}_t = H^r_t + g^r_t * f(H^r_t)             if t in top-k_r   (weighted, combine 'layer_output')
              = H^r_t + g^r_t * (f(H^r_t) - H^r_t)     if t in top-k_r   (weighted, combine 'layer_update')
              = H^r_t                                  otherwise

f is the recursion block with its residual connections. k = tokens_kept(T, capacity_r,
model.router.capacity_rounding); the BCE enters the loss with weight aux_coeff x aux_accum_steps
(mor.config.RouterConfig.aux_weight).

The decision (top-k) and the gate are routing.py's ``decide`` and ``gate``.
"""

from __future__ import annotations

import torch

from mor.capacity import capacities, tokens_kept
from mor.model.kv_sharing import run_kv_layer
from mor.model.router import add_rows, flat_rows, take_rows
from mor.model.router_losses import expert_choice_aux_bce, router_z_loss
from mor.model.routing import decide, gate


def run_expert_choice(model, h: torch.Tensor, positions: torch.Tensor, trace, max_depth: int | None = None):
    """h: (B, T, C) after the prefix layers -> (h, weighted router loss).

    ``max_depth``: run recursions 1..max_depth only (default all Nr); the trace then holds
    those recursions.

    Selected rows move by index_select / index_add on the flattened (B*T, C) view (the
    write-back adds the gated update delta = new - h_sel), router losses over the candidates
    are masked means, and the number of candidates is tracked in Python: no host sync and no
    data-dependent shapes.
    """
    B, T, C = h.shape  # batch, tokens, channels
    rcfg = model.cfg.router
    caps = capacities(model.cfg.num_recursions, rcfg.capacity)
    active = torch.ones(B, T, dtype=torch.bool, device=h.device)  # (B, T)
    n_active = T  # candidates per sequence: hierarchical top-k keeps exactly k in every row
    aux = h.new_zeros((), dtype=torch.float32)
    kv_store: dict = {}  # producer layer -> its (k, v, positions) over the tokens it ran on
    for r, rec in enumerate(model.plan.recursions[:max_depth]):
        router = model.routers[r]
        # capacity warm-up widens early steps; written so that it is caps[r] to the bit once the
        # warm-up is over (1 - (1 - 1/3) is 0.33333333333333326: floor would keep 3 of 12, not 4)
        frac = caps[r] + (1.0 - caps[r]) * (1.0 - model.capacity_scale)
        k = min(tokens_kept(T, frac, rcfg.capacity_rounding), n_active)
        d = decide(model, r, h, active, policy="topk", k=k, n_active=n_active)  # routing.py
        logits, causal, weights, selected = d.logits, d.causal, d.g, d.keep  # (B, T) each
        cand = None if n_active == T else active  # None: every token is a candidate
        full = d.idx is None  # every token kept (hierarchical recursion 1): skip gather, scatter
        if full:
            g, h_sel, pos_sel = weights, h, positions  # (B, T), (B, T, C), (B, T)
        else:
            flat = flat_rows(d.idx, T)  # (B*k,) rows of the (B*T, C) view
            g = take_rows(weights, flat)  # (B, k)
            h_sel = take_rows(h, flat)  # (B, k, C)
            pos_sel = positions.gather(1, d.idx)  # (B, k)
        out = h_sel
        for j, layer_id in enumerate(rec):  # KV strategy per layer: kv_sharing.run_kv_layer
            e = len(model.plan.prefix) + r * len(rec) + j  # effective layer index
            out = run_kv_layer(model, e, layer_id, out, pos_sel, r, kv_store)  # (B, k, C)
        out = model.end_recursion(r, out)  # (B, k, C) recursion PE relaxation hook
        if full:
            h = gate(rcfg, h_sel, out, g)  # (B, T, C)
        else:  # h_sel + delta = the gated new state, written back by adding delta
            h = add_rows(h, flat, gate(rcfg, h_sel, out, g, delta=True))  # (B, T, C)
        if model.training:
            target = causal if router.aux_head is not None else logits
            aux = aux + rcfg.aux_weight * expert_choice_aux_bce(target, selected, cand)
            if rcfg.z_loss_coeff:
                aux = aux + rcfg.z_loss_coeff * router_z_loss(logits, per_token_scalar=True, mask=cand)
        trace.selected.append(selected)
        trace.candidates.append(active)
        trace.scores.append(weights.detach())
        trace.causal_keep.append((causal.detach() > 0) & active)
        active, n_active = selected, k
    return h, aux
