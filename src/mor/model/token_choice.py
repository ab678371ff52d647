"""Token-choice recursion: each token takes the depth its router chose, 1..Nr.

One router (``TokenChoiceRouter``) scores the Nr depths of every token before the first
recursion; token t with depth d_t runs recursions 1..d_t. At recursion r the active tokens
are {t : d_t >= r}, a different number in every sequence. They are PACKED without Python
loops or per-sample writes:

  * recursion 1 runs on every token in the original order;
  * at recursion r > 1 a stable partition of the slots still running puts each sequence's
    active tokens first, in position order (one row permutation of (B, k_{r-1}, C));
    the first k_r = max active count slots run the shared layers, the rest are finished
    in every sequence and are set aside; slots past a sequence's own count (padding: its
    finished tokens) run too and are reset afterwards with one ``where``;
  * at the end one inverse permutation restores the original order.

Active sets are nested, so each permutation only touches the slots of the previous
recursion, and the permutations' backward is again a permutation (no zeros + scatter_add).
Because packed slots are in position order and padding sorts after every active token,
plain causal attention over the packed slots is exact for the active tokens
(recursion-wise: the key-padding mask is implied; the flash / fused SDPA path stays usable).

Update rule (as in the authors' released code), H^1 = state entering the stack, f = one
recursion of the shared block, recursions counted from 1:

    H^{r+1}_t = f(H^r_t)                        for r <= d_t  (no weight in between)
    out_t     = H^1_t + g_t * H^{d_t+1}_t        gating 'weighted'
              = H^{d_t+1}_t + g_t                gating 'additive' (as in expert_choice.py)

with g_t = alpha * f_router(logit of d_t). The router sees gradient only through g_t (and
the balancing / z losses); top-1 is not differentiable.

KV strategies in training (``model.kv``); recursion 1 always runs on every token:
  recursion_wise  attention at recursion r only among the tokens active at r.
  shared          recursion r > 1 reuses the keys/values that the layer at the same slot of
                  recursion 1 computed for ALL tokens; only the active tokens' queries are
                  computed (explicit mask: causal over original positions).
  shared_dagger   as shared, but the active tokens' keys/values are computed afresh; only
                  the inactive positions keep their recursion-1 keys/values.
The shared strategies compute keys/values with ``model.layer_kv``, which applies the same
relaxation hooks (LoRA / DoRA on k/v projections) as ``run_layer``.

Balancing warm-up (``router.capacity_warmup_steps`` reinterpreted for token-choice, as the
authors' ``bal_warmup_step``): while the trainer's ``capacity_scale`` < 1, training sends
every token through all Nr recursions and the loss-free bias is not updated; the balancing
loss still trains the router on the depths it would have chosen.
"""

from __future__ import annotations

import torch

from mor.model.router_losses import router_z_loss, token_choice_balance_loss


def partition(active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable partition of each row: active slots first, in their current order, then the rest.

    active: (B, w) bool -> perm (B, w) long (slot j of the result takes slot perm[b, j]) and
    count (B,) active slots per row. Same result as a stable sort on ~active, computed with
    cumsums (O(w), no sort).
    """
    B, w = active.shape  # batch, slots
    a = active.long()  # (B, w)
    count = a.sum(1)  # (B,)
    dest = torch.where(active, a.cumsum(1) - 1, count.unsqueeze(1) + (1 - a).cumsum(1) - 1)  # (B, w)
    order = torch.arange(w, device=active.device).expand(B, w)  # (B, w)
    return torch.zeros_like(dest).scatter(1, dest, order), count  # (B, w), (B,)


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """perm (B, w) -> inv (B, w) with inv[b, perm[b, j]] = j."""
    order = torch.arange(perm.shape[1], device=perm.device).expand_as(perm)  # (B, w)
    return torch.zeros_like(perm).scatter(1, perm, order)


class _PermuteRows(torch.autograd.Function):
    """y[b, j] = x[b, perm[b, j]] for a per-row permutation; the gradient is the inverse one.

    A plain gather would back-propagate with zeros + scatter_add (two passes over the
    tensor); a permutation needs one row copy each way.
    """

    @staticmethod
    def forward(ctx, x, perm):
        ctx.save_for_backward(perm)
        return _take_rows(x, perm)

    @staticmethod
    def backward(ctx, grad):
        (perm,) = ctx.saved_tensors
        return _take_rows(grad, inverse_permutation(perm)), None


def _take_rows(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x (B, w, C), perm (B, w) -> (B, w, C) via one index_select over flattened rows."""
    B, w, C = x.shape  # batch, slots, channels
    flat = (perm + torch.arange(B, device=perm.device).unsqueeze(1) * w).reshape(-1)  # (B*w,)
    return x.reshape(B * w, C).index_select(0, flat).view(B, w, C)  # (B, w, C)


def permute_rows(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x: (B, w, C), perm: (B, w) a permutation of 0..w-1 per row -> (B, w, C)."""
    return _PermuteRows.apply(x, perm)


def shared_kv_mask(pos: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, 1, k, T) bool: packed query at pos_i sees every token at an earlier-or-equal position.

    A padding slot is a real (finished) token, so its row is never empty (no NaN).
    """
    return (positions.unsqueeze(1) <= pos.unsqueeze(2)).unsqueeze(1)  # (B, 1, k, T)


def _mix_kv(kv1, fresh, idx: torch.Tensor, valid: torch.Tensor):
    """Recursion-1 keys/values (B, Hkv, T, hd) with tokens idx[valid] replaced by fresh ones.

    idx: (B, k) original token index of each packed slot; fresh: (B, Hkv, k, hd) each.
    """
    out = []
    for full, new in zip(kv1, fresh):
        Hkv, hd = full.shape[1], full.shape[3]
        sel = idx[:, None, :, None].expand(-1, Hkv, -1, hd)  # (B, Hkv, k, hd)
        new = torch.where(valid[:, None, :, None], new, full.gather(2, sel))  # (B, Hkv, k, hd)
        out.append(full.scatter(2, sel, new))  # (B, Hkv, T, hd)
    return tuple(out)


def _run_recursion(model, r, rec, x, pos, positions, kv1, slots, valid):
    """Shared layers of recursion r on packed x: (B, k, C) at positions pos (B, k).

    slots: (B, k) original token index of each slot; valid: (B, k) active (not padding).
    """
    kv_mode = model.cfg.kv
    mask = None if kv_mode == "recursion_wise" else shared_kv_mask(pos, positions)  # (B, 1, k, T)
    for j, layer_id in enumerate(rec):
        kv = None
        if kv_mode == "shared":
            kv = kv1[j]  # (B, Hkv, T, hd) each
        elif kv_mode == "shared_dagger":
            kv = _mix_kv(kv1[j], model.layer_kv(layer_id, x, pos, recursion=r), slots, valid)
        x = model.run_layer(layer_id, x, pos, recursion=r, kv=kv, attn_mask=mask)  # (B, k, C)
    return model.end_recursion(r, x)  # (B, k, C) recursion PE relaxation hook


def run_token_choice(model, h: torch.Tensor, positions: torch.Tensor, trace):
    """h: (B, T, C) after the prefix layers -> (h, weighted router loss). Fills ``trace``."""
    B, T, C = h.shape  # batch, tokens, channels
    rcfg, kv_mode = model.cfg.router, model.cfg.kv
    Nr = model.cfg.num_recursions
    router = model.routers[0]
    logits = router.logits(h)  # (B, T, Nr)
    scores = router.scores(logits)  # (B, T, Nr)
    probs = router.probs(logits, scores)  # (B, T, Nr)
    choice = router.choose(probs)  # (B, T) expert id = depth - 1
    warmup = model.training and model.capacity_scale < 1.0
    assignment = torch.full_like(choice, Nr - 1) if warmup else choice  # (B, T)
    g = rcfg.alpha * scores.gather(-1, assignment.unsqueeze(-1)).squeeze(-1)  # (B, T)

    aux = h.new_zeros((), dtype=torch.float32)
    if model.training:
        if rcfg.balancing == "loss" and rcfg.balance_coeff:
            aux = aux + rcfg.balance_coeff * token_choice_balance_loss(probs, choice, Nr)
        if rcfg.z_loss_coeff:
            aux = aux + rcfg.z_loss_coeff * router_z_loss(logits)
        if rcfg.balancing == "loss_free" and not warmup:
            router.record_load(choice)

    reached = torch.ones(B, T, dtype=torch.bool, device=h.device)  # (B, T)
    for r in range(Nr):
        active = assignment >= r  # (B, T)
        trace.selected.append(active)
        trace.candidates.append(reached)
        trace.causal_keep.append(active)  # the training decision is already causal
        trace.scores.append(rcfg.alpha * scores[..., r].detach())  # (B, T) weight if d_t = r+1
        reached = active

    # recursion 1: every token, original order (recursion 1's K/V are what 'shared' reuses)
    h1, x = h, h
    kv1: list[tuple[torch.Tensor, torch.Tensor]] = []
    for layer_id in model.plan.recursions[0]:
        kv = None
        if kv_mode != "recursion_wise":
            kv = model.layer_kv(layer_id, x, positions, recursion=0)  # (B, Hkv, T, hd) each; relaxation-aware
            kv1.append(kv)
        x = model.run_layer(layer_id, x, positions, recursion=0, kv=kv)  # (B, T, C)
    x = model.end_recursion(0, x)  # (B, T, C) recursion PE relaxation hook

    # recursions 2..Nr on packed slots; slots[b, j] = original token index of slot j
    slots = torch.arange(T, device=h.device).expand(B, T)  # (B, T)
    depth = assignment  # (B, w) depth - 1 of the token in each running slot
    done: list[torch.Tensor] = []  # finished slot blocks, last recursion first
    done_slots: list[torch.Tensor] = []
    for r, rec in enumerate(model.plan.recursions[1:], start=1):
        w = x.shape[1]
        perm, count = partition(depth >= r)  # (B, w), (B,)
        k, k_min = (int(v) for v in torch.stack([count.max(), count.min()]).tolist())
        if k_min < w:  # some slot finished: active first, in position order
            x = permute_rows(x, perm)  # (B, w, C)
            slots, depth = slots.gather(1, perm), depth.gather(1, perm)  # (B, w)
            x, finished = x.split([k, w - k], dim=1)  # (B, k, C), (B, w-k, C): one backward cat
            done.insert(0, finished)  # finished in every sequence
            done_slots.insert(0, slots[:, k:])
            slots, depth = slots[:, :k], depth[:, :k]  # (B, k), (B, k)
        if k == 0:
            break
        valid = torch.arange(k, device=h.device) < count.unsqueeze(1)  # (B, k)
        pos = positions.gather(1, slots)  # (B, k)
        out = _run_recursion(model, r, rec, x, pos, positions, kv1, slots, valid)  # (B, k, C)
        x = out if k_min == k else torch.where(valid.unsqueeze(-1), out, x)  # padding keeps its state
    if done:
        x = torch.cat([x, *done], dim=1)  # (B, T, C) in slot order
        slots = torch.cat([slots, *done_slots], dim=1)  # (B, T)
        x = permute_rows(x, inverse_permutation(slots))  # (B, T, C) original order

    gate = g.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    out = torch.addcmul(h1, gate, x) if rcfg.gating == "weighted" else x + gate  # (B, T, C)
    trace.probs = probs.detach()
    trace.assignment = assignment
    return out, aux
