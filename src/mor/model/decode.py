"""Incremental decoding with the KV cache, and the full-prefix reference it must match.

    cache, logits = prefill(model, prompt)          # (B, T) -> cache, (B, V) next-token logits
    logits = decode_step(model, cache, token)       # (B,)   -> (B, V)
    out = generate(model, prompt, max_new_tokens)   # greedy, (B, T + n)

Routing at inference must be causal: a token's depth may depend only on itself and the
past. Expert-choice top-k looks at the whole sequence, so decoding replaces it by the
per-token decision the auxiliary loss / auxiliary router trains (router.py):

    keep_r(t) = keep_{r-1}(t) and causal_logit_r(h_t) > 0      (hierarchical)

where causal_logit is the router logit (aux 'aux_loss') or the auxiliary head's logit
('aux_router'). A recursion whose capacity is 1 (the first, with hierarchical capacities)
keeps every candidate, as its top-k does: that decision is already causal. The router
weight g and the gating are the training ones. Token-choice routing is causal as trained:
each token's depth comes from its own state at the start of the recursion stack.
Both decisions and the gate are routing.py's ``decide`` / ``token_depths`` and ``gate``.

KV strategies (``model.cfg.kv``, see kv_sharing.py and kv_cache.py): recursion-wise, a token's KV is written
only into the slots of the recursions it reaches, and recursion r attends over recursion
r's slot only; shared, recursions r > 1 read the recursion-1 slot; dagger, recursion r's
slot mirrors recursion 1's with the entries of the tokens that reached r recomputed.

Prefill runs the prompt as one chunk. Layers after the last one that writes the cache
affect only the logits, so a prefill that returns only the last position's logits runs
them on the last token alone. For KV sharing with no unshared layer after the recursions
(Cycle) that is App. H's "only the first recursion runs at prefill"; Middle-* schemes keep
an unshared last layer whose cache needs every token at full depth, so they cannot skip.

``full_forward_causal(model, idx)`` is the reference: one pass over the whole prefix with
the same causal routing, computing every token at every layer and masking keys to the
tokens each layer's KV holds (no gather, no cache), so cached decoding can be checked
against it. ``full_forward_routed`` does the same under given routing decisions (e.g. the
training top-k), which checks the training-time KV sharing.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from mor.model.kv_cache import KVCache, cache_layout
from mor.model.router import gather_tokens, scatter_tokens
from mor.model.routing import TokenDepths, decide, depths_up_front, gate
from mor.model.transformer import ModelOutput, RoutingTrace, check_max_depth


# --------------------------------------------------------------------------------------
# Routing at inference (shared by the reference and the cached path)
# --------------------------------------------------------------------------------------
def _route_start(model, h: torch.Tensor) -> TokenDepths | None:
    """State needed before recursion 1: the router kind's (token-choice picks depths here;
    expert-choice nothing)."""
    return model.router_kind.start(model, h) if model.routers else None


def causal_decision(model, r: int, h: torch.Tensor, active: torch.Tensor, state: TokenDepths | None = None):
    """(keep (B, T) bool, router weight g (B, T) or None) for recursion r at inference."""
    d = decide(model, r, h, active, policy="causal", depths=state)
    return d.keep, d.g


def _route_finish(model, h: torch.Tensor, state: TokenDepths | None) -> torch.Tensor:
    """Token-choice: the gate after the stack (routing.gate, absolute); expert-choice: h."""
    return h if state is None else gate(model.cfg.router, state.h1, h, state.g, relative=False)


# --------------------------------------------------------------------------------------
# Reference: the whole prefix in one pass, every token computed, keys masked
# --------------------------------------------------------------------------------------
Decide = Callable[[int, torch.Tensor, torch.Tensor, object], tuple[torch.Tensor, torch.Tensor | None]]


@torch.no_grad()
def full_forward_causal(model, idx: torch.Tensor, logits_at: torch.Tensor | None = None,
                        max_depth: int | None = None) -> ModelOutput:
    """Logits (B, T, V) of the whole prefix under the causal inference routing (or (B, n, V) at
    positions ``logits_at`` (B, n) only); the trace's ``selected`` holds each recursion's keep
    mask (None for unrouted models). ``max_depth`` caps the recursions run, as in
    ``model(idx, max_depth=...)``."""
    return _reference_forward(model, idx, lambda r, h, active, state: causal_decision(model, r, h, active, state),
                              logits_at, max_depth)


@torch.no_grad()
def full_forward_routed(model, idx: torch.Tensor, selected: list[torch.Tensor]) -> ModelOutput:
    """As ``full_forward_causal`` but recursion r keeps ``selected[r]`` (B, T) bool, e.g. the
    training top-k of ``model(idx).routing.selected`` (expert-choice only)."""
    if not model.routers or depths_up_front(model):
        raise ValueError("full_forward_routed needs a MoR model routed per recursion (expert-choice)")

    def decide(r, h, active, state):
        return selected[r], model.routers[r].weights(model.routers[r].logits(h))

    return _reference_forward(model, idx, decide)


def _reference_forward(model, idx: torch.Tensor, decide: Decide, logits_at: torch.Tensor | None = None,
                       max_depth: int | None = None) -> ModelOutput:
    B, T = idx.shape  # batch, tokens
    depth = check_max_depth(max_depth, len(model.plan.recursions))
    if T > model.shape.max_seq_len:  # RoPE does not check positions (that would sync the device)
        raise ValueError(f"sequence length {T} exceeds max_seq_len {model.shape.max_seq_len}")
    positions = torch.arange(T, device=idx.device).expand(B, T)  # (B, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()  # (T, T)
    everyone = torch.ones(B, T, dtype=torch.bool, device=idx.device)  # (B, T)
    store: dict = {}  # producer layer -> (k, v, which tokens its KV holds (B, T))

    def layer(e, layer_id, x, keep, recursion):
        """Effective layer e on all T tokens; keys restricted to the tokens its KV holds."""
        p = model.kv_producers[e]
        if p == e:
            k, v = model.layer_kv(layer_id, x, positions, recursion)  # (B, Hkv, T, hd) each
            held = keep
            store[e] = (k, v, keep)
        else:
            k, v, held = store[p]
            if model.cfg.kv == "shared_dagger":
                fk, fv = model.layer_kv(layer_id, x, positions, recursion)  # (B, Hkv, T, hd)
                fresh = keep[:, None, :, None]  # (B, 1, T, 1)
                k, v = torch.where(fresh, fk, k), torch.where(fresh, fv, v)
        eye = torch.eye(T, dtype=torch.bool, device=x.device)  # rows of dropped tokens: never empty
        mask = ((causal & held.unsqueeze(1)) | eye).unsqueeze(1)  # (B, 1, T, T)
        return model.run_layer(layer_id, x, positions, recursion, kv=(k, v), attn_mask=mask)

    h = model.embed_tokens(idx)  # (B, T, C)
    e = 0
    for layer_id in model.plan.prefix:
        h = layer(e, layer_id, h, everyone, None)
        e += 1
    trace = RoutingTrace() if model.routers else None
    state = _route_start(model, h)
    active = everyone
    for r, rec in enumerate(model.plan.recursions):
        if r >= depth:  # capped: the later recursions' layers are skipped (their effective indices too)
            e += len(rec)
            continue
        keep, g = decide(r, h, active, state) if model.routers else (everyone, None)
        out = h
        for layer_id in rec:
            out = layer(e, layer_id, out, keep, r)
            e += 1
        out = model.end_recursion(r, out)
        new = gate(model.cfg.router, h, out, g) if model.routers else out
        h = torch.where(keep.unsqueeze(-1), new, h)  # (B, T, C)
        if trace is not None:
            trace.selected.append(keep)
            trace.candidates.append(active)
            trace.causal_keep.append(keep)
            if g is not None:
                trace.scores.append(g)
        active = keep
    h = _route_finish(model, h, state)
    for layer_id in model.plan.suffix:
        h = layer(e, layer_id, h, everyone, None)
        e += 1
    return ModelOutput(logits=model.head(h, logits_at), routing=trace)


# --------------------------------------------------------------------------------------
# Cached decoding
# --------------------------------------------------------------------------------------
def init_cache(model, batch: int, max_len: int, *, sizing: str = "full", dtype=None, device=None) -> KVCache:
    """A zeroed cache for ``batch`` sequences of up to ``max_len`` tokens (see kv_cache.py)."""
    if max_len > model.shape.max_seq_len:
        raise ValueError(f"max_len={max_len} exceeds the model's max_seq_len {model.shape.max_seq_len}")
    w = model.embed_tokens.weight
    specs = cache_layout(model.cfg, model.plan, model.kv_producers, max_len, sizing)
    return KVCache(specs, batch, max_len, model.shape.kv_heads, model.shape.head_dim,
                   dtype or w.dtype, device or w.device, owner=id(model))


def prefill(model, idx: torch.Tensor, max_len: int | None = None, *, cache: KVCache | None = None,
            sizing: str = "full", all_logits: bool = False):
    """Run prompt ``idx`` (B, T) through the model, filling the cache.

    A new cache of ``max_len`` (default T) tokens is made unless ``cache`` is given, in which
    case the prompt is appended (chunked prefill). Returns (cache, logits): logits (B, V) of
    the last position, or (B, T, V) for every position with ``all_logits`` (which computes
    every layer for every token; the default may skip the layers after the last cache
    writer for all but the last token).
    """
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"prefill expects token ids of shape (B, T) with T >= 1, got {tuple(idx.shape)}")
    if cache is None:
        cache = init_cache(model, idx.shape[0], max_len or idx.shape[1], sizing=sizing)
    logits = _forward_chunk(model, cache, idx, last_only=not all_logits)  # (B, T or 1, V)
    return cache, (logits if all_logits else logits[:, -1])


def decode_step(model, cache: KVCache | None, token: torch.Tensor) -> torch.Tensor:
    """Feed one token per sequence, (B,) or (B, 1); returns next-token logits (B, V)."""
    if cache is None:
        raise RuntimeError("decode_step() needs a KV cache: call prefill(model, prompt) or "
                           "init_cache(model, batch, max_len) first")
    if token.dim() == 1:
        token = token.unsqueeze(1)  # (B, 1)
    if token.dim() != 2 or token.shape[1] != 1:
        raise ValueError(f"decode_step expects one token per sequence, (B,) or (B, 1); got {tuple(token.shape)}")
    return _forward_chunk(model, cache, token, last_only=True)[:, -1]  # (B, V)


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, max_len: int | None = None) -> torch.Tensor:
    """Greedy continuation of prompt ``idx`` (B, T) by ``max_new_tokens``: (B, T + n)."""
    if max_new_tokens < 1:
        return idx
    cache, logits = prefill(model, idx, max_len or idx.shape[1] + max_new_tokens)
    out = [idx]
    for i in range(max_new_tokens):
        token = logits.argmax(-1)  # (B,)
        out.append(token.unsqueeze(1))
        if i + 1 < max_new_tokens:
            logits = decode_step(model, cache, token)
    return torch.cat(out, dim=1)


def _cached_layer(model, cache: KVCache, e: int, layer_id: int, x, pos, valid, recursion):
    """Effective layer e on x (B, n, C) at positions ``pos`` (B, n); ``valid`` (B, n) marks real
    tokens (the rest pad a packed batch: never written, outputs discarded)."""
    spec = cache.specs[e]
    if spec.kind == "own":
        slot = cache.slots[e]
        k, v = model.layer_kv(layer_id, x, pos, recursion)  # (B, Hkv, n, hd) each
        slot.append(k, v, pos, valid)
    elif spec.kind == "dagger":
        slot = cache.slots[e]
        slot.mirror(cache.slots[spec.source])  # the producer's entries for tokens not seen yet
        k, v = model.layer_kv(layer_id, x, pos, recursion)  # fresh KV of the tokens that reached e
        slot.overwrite(k, v, pos, valid)
    else:  # shared: read the producer's slot, compute queries only
        slot = cache.slot(e)
    mask = slot.mask(pos, valid)  # (B, 1, n, S)
    return model.run_layer(layer_id, x, pos, recursion, kv=(slot.k, slot.v), attn_mask=mask)


@torch.no_grad()
def _forward_chunk(model, cache: KVCache, idx: torch.Tensor, last_only: bool) -> torch.Tensor:
    """Consume tokens idx (B, Tc) at positions cache.seen.. ; logits (B, Tc or 1, V)."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"expected a KVCache from init_cache()/prefill(), got {type(cache).__name__}")
    B, Tc = idx.shape  # batch, new tokens
    cache.check(model, B, Tc)
    plan, start = model.plan, cache.seen
    positions = torch.arange(start, start + Tc, device=idx.device).expand(B, Tc)  # (B, Tc)
    narrow = last_only and Tc > 1  # may drop all but the last token after the last cache writer
    depth = torch.full((B, Tc), len(plan.recursions), dtype=torch.long, device=idx.device)  # (B, Tc)

    h = model.embed_tokens(idx)  # (B, Tc, C)
    e = 0
    for layer_id in plan.prefix:
        h = _cached_layer(model, cache, e, layer_id, h, positions, torch.ones_like(positions, dtype=torch.bool), None)
        e += 1
    if model.routers:
        depth.zero_()
        state = _route_start(model, h)
        active = torch.ones(B, Tc, dtype=torch.bool, device=idx.device)  # (B, Tc)
        for r, rec in enumerate(plan.recursions):
            if narrow and e > cache.last_writer and h.shape[1] > 1:
                depth[:, :-1].masked_fill_(active[:, :-1], -1)  # still running: depth not computed
                h, positions, active = h[:, -1:], positions[:, -1:], active[:, -1:]
                state = state.rows(slice(-1, None)) if state is not None else None
            keep, g = causal_decision(model, r, h, active, state)  # (B, t) each
            depth[:, Tc - h.shape[1]:] += keep.long()
            n = keep.sum(1)  # (B,) tokens of each sequence that run recursion r
            K = int(n.max())
            if K > 0:
                order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)  # kept first, in position order
                sel = order[:, :K]  # (B, K)
                valid = torch.arange(K, device=idx.device) < n.unsqueeze(1)  # (B, K)
                x0 = gather_tokens(h, sel)  # (B, K, C)
                pos = positions.gather(1, sel)  # (B, K)
                x = x0
                for j, layer_id in enumerate(rec):
                    x = _cached_layer(model, cache, e + j, layer_id, x, pos, valid, r)  # (B, K, C)
                x = model.end_recursion(r, x)
                x = gate(model.cfg.router, x0, x, None if g is None else g.gather(1, sel))  # (B, K, C)
                x = torch.where(valid.unsqueeze(-1), x, x0)  # padding rows keep their state
                h = scatter_tokens(h, sel, x)  # (B, t, C)
            e += len(rec)
            active = keep
        h = _route_finish(model, h, state)
    else:
        for r, rec in enumerate(plan.recursions):
            for layer_id in rec:
                if narrow and e > cache.last_writer and h.shape[1] > 1:
                    h, positions = h[:, -1:], positions[:, -1:]
                ones = torch.ones_like(positions, dtype=torch.bool)
                h = _cached_layer(model, cache, e, layer_id, h, positions, ones, r)
                e += 1
            h = model.end_recursion(r, h)
    for layer_id in plan.suffix:
        if narrow and e > cache.last_writer and h.shape[1] > 1:
            h, positions = h[:, -1:], positions[:, -1:]
        h = _cached_layer(model, cache, e, layer_id, h, positions, torch.ones_like(positions, dtype=torch.bool), None)
        e += 1
    if last_only:
        h = h[:, -1:]
    cache.depth[:, start:start + Tc] = depth
    cache.seen += Tc
    return F.linear(model.norm(h), model.lm_head_weight)  # (B, Tc or 1, V)
