"""Token-choice recursion: each token takes the depth its router chose, 1..Nr.

One router (``TokenChoiceRouter``) scores the Nr depths of every token before the first
recursion; token t with depth d_t runs recursions 1..d_t. At recursion r the active tokens
are {t : d_t >= r}, a different number in every sequence. They are PACKED without Python
loops or per-sample writes:

  * recursion 1 runs on every token in the original order;
  * entering recursion r > 1, a stable partition of the rows of the previous block
    (B, k_{r-1}, C) splits it, one row gather each, into the rows that run on (the first
    k_r = max running count of a sequence) and the rows whose token stopped after r-1,
    set aside in position order (B, max stopping count, C). Each sequence's running
    tokens come first, in position order; the rows past its own count are padding (other
    tokens of the block): they run too, but their outputs are never read;
  * at the end one row gather over the set-aside blocks and the last block restores the
    original order: a token's final state is read from the block where it stopped.

Active sets are nested, so each split only touches the rows of the previous block. Because
packed rows are in position order and padding sorts after every running token, plain
causal attention over the packed rows is exact for the running tokens (recursion-wise: the
key-padding mask is implied; the flash / fused SDPA path stays usable), and nothing a
padding row holds reaches a running token. So padding needs no reset, its exact gradient
is zero, and the custom backwards (``_Split``, ``_Merge``) drop it instead of adding
zeros: each backward is again one row gather (no zeros + scatter_add, no gradient sums).
All shapes come from one host sync of the per-depth token counts (``depth_counts``).

Update rule (as in the authors' released code), H^1 = state entering the stack, f = one
recursion of the shared block, recursions counted from 1:

    H^{r+1}_t = f(H^r_t)                        for r <= d_t  (no weight in between)
    out_t     = H^1_t + g_t * H^{d_t+1}_t        gating 'weighted'
              = H^{d_t+1}_t + g_t                gating 'additive' (as in expert_choice.py)

with g_t = alpha * f_router(logit of d_t). The router sees gradient only through g_t (and
the balancing / z losses); top-1 is not differentiable. Weighted gating is one custom
Function (``routing._WeightedGate``) whose backward takes the fewest passes over (B, T, C).
The depth decision and the gate are routing.py's ``token_depths`` / ``decide`` and ``gate``;
the KV strategies are ``kv_sharing.run_kv_layer`` (with the packed rows' ``valid`` mask).

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

from mor.model.kv_sharing import run_kv_layer
from mor.model.router_losses import router_z_loss, token_choice_balance_loss
from mor.model.routing import decide, gate


def partition(active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stable partition of each row: active slots first, in their current order, then the rest.

    active: (B, w) bool -> perm (B, w) long (slot j of the result takes slot perm[b, j]), its
    inverse dest (B, w) (slot j goes to dest[b, j]; for an active slot its rank among the
    active ones) and count (B,) active slots per row. Same result as a stable sort on
    ~active, computed with cumsums (O(w), no sort).
    """
    B, w = active.shape  # batch, slots
    a = active.long()  # (B, w)
    count = a.sum(1)  # (B,)
    dest = torch.where(active, a.cumsum(1) - 1, count.unsqueeze(1) + (1 - a).cumsum(1) - 1)  # (B, w)
    order = torch.arange(w, device=active.device).expand(B, w)  # (B, w)
    return torch.zeros_like(dest).scatter(1, dest, order), dest, count  # (B, w), (B, w), (B,)


class _Split(torch.autograd.Function):
    """Split a block at a recursion boundary: the rows that run on and the rows that stop.

    forward(x (B, w, C), run (B, k), stop (B, f), back (B*w,)) -> rows (B, k, C) and
    (B, f, C) of x; run / stop hold flat row indices of x viewed as (B*w, C). Padding
    entries of run / stop may name any row: their values never reach a valid state (see
    the module docstring), so their exact gradient is zero and the backward drops it.
    ``back`` maps each row of x to its row in cat(grad run, grad stop, one zero row) (the
    zero row for x's own padding): the backward is one cat and one row gather, not
    zeros + two scatter_adds + an add.
    """

    @staticmethod
    def forward(ctx, x, run, stop, back):
        ctx.save_for_backward(back)
        ctx.shape = x.shape
        B, _, C = x.shape  # batch, rows, channels
        rows = x.reshape(-1, C)  # (B*w, C)
        x_run = rows.index_select(0, run.reshape(-1)).view(B, -1, C)  # (B, k, C)
        return x_run, rows.index_select(0, stop.reshape(-1)).view(B, -1, C)  # (B, f, C)

    @staticmethod
    def backward(ctx, grad_run, grad_stop):
        (back,) = ctx.saved_tensors
        C = ctx.shape[-1]
        rows = torch.cat([grad_run.reshape(-1, C), grad_stop.reshape(-1, C), grad_run.new_zeros(1, C)])
        return rows.index_select(0, back).view(ctx.shape), None, None, None


class _Merge(torch.autograd.Function):
    """Original token order from the blocks where the tokens stopped.

    forward(src (B*T,), rev (R,), pad (P,) or None, *blocks (B, n_i, C)) -> (B, T, C). The
    blocks' rows, flattened and concatenated, are R rows; ``src`` is the row of each
    token's final state, ``rev`` the flat token index of each row (padding rows: any
    token). The backward is one row gather. A padding row gets a stray gradient: the
    backward of ``_Split``, which made every block but the last, drops it; the last block
    is a layer output, so its padding rows (flat rows ``pad`` of it) are zeroed.
    """

    @staticmethod
    def forward(ctx, src, rev, pad, *blocks):
        B, _, C = blocks[0].shape
        ctx.save_for_backward(rev, pad)
        ctx.shapes = [blk.shape for blk in blocks]
        rows = torch.cat([blk.reshape(-1, C) for blk in blocks])  # (R, C)
        return rows.index_select(0, src).view(B, -1, C)  # (B, T, C)

    @staticmethod
    def backward(ctx, grad):
        rev, pad = ctx.saved_tensors
        C = grad.shape[-1]
        rows = grad.reshape(-1, C).index_select(0, rev)  # (R, C)
        grads = rows.split([shape.numel() // C for shape in ctx.shapes])
        if pad is not None:
            grads[-1].index_fill_(0, pad, 0)
        return None, None, None, *(g.view(shape) for g, shape in zip(grads, ctx.shapes))


def depth_counts(assignment: torch.Tensor, num_recursions: int) -> list[list[int]]:
    """Every shape the packing needs, copied to the host in one sync.

    Three lists [run_max, run_total, stop_max], one entry per recursion r (0-based): the
    max over sequences and the total of the tokens that run r (depth - 1 >= r), and the
    max tokens of a sequence that stop after r (depth - 1 == r).
    """
    depths = torch.arange(num_recursions, device=assignment.device)  # (Nr,)
    per_depth = (assignment.unsqueeze(-1) == depths).sum(1)  # (B, Nr)
    running = assignment.shape[1] - per_depth.cumsum(1) + per_depth  # (B, Nr)
    return torch.stack([running.amax(0), running.sum(0), per_depth.amax(0)]).tolist()


def split_block(x: torch.Tensor, depth: torch.Tensor, r: int, k: int, f: int) -> tuple[torch.Tensor, ...]:
    """Block x (B, w, C) leaving recursion r-1 (0-based r) -> (rows that run recursion r
    (B, k, C), rows whose token stops after r-1 (B, f, C), run (B, k) source row of each
    running row, n_run (B,) valid running rows per sequence). Both keep position order.

    depth: (B, w) depth - 1 of the token in each row. A padding row holds a token with
    depth - 1 < r - 1: it neither runs nor stops. After a sequence's running rows the
    stable partition lists its stopping rows (valid, so before its padding), then its
    padding; the first of those rows pad the running block (distinct tokens, as the dagger
    KV refresh of ``run_kv_layer`` needs).
    """
    B, w, _ = x.shape  # batch, rows, channels
    active = depth >= r  # (B, w)
    perm, dest, n_run = partition(active)  # (B, w), (B, w), (B,)
    b = torch.arange(B, device=x.device).unsqueeze(1)  # (B, 1)
    flat = perm + b * w  # (B, w) rows of x viewed as (B*w, C)
    first_stop = n_run.unsqueeze(1)  # (B, 1)
    stop = flat.gather(1, (first_stop + torch.arange(f, device=x.device)).clamp(max=w - 1))  # (B, f)
    stop_row = torch.where(depth == r - 1, B * k + b * f + dest - first_stop, B * (k + f))  # (B, w)
    back = torch.where(active, b * k + dest, stop_row).reshape(-1)  # (B*w,)
    x_run, x_stop = _Split.apply(x, flat[:, :k], stop, back)
    return x_run, x_stop, perm[:, :k], n_run


def final_rows(assignment: torch.Tensor, widths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each token's final state lies in the flat concatenation of the stop blocks.

    Block d (width widths[d], absent if 0) holds the tokens with depth - 1 == d in position
    order. Returns src (B*T,) the row of each token and rev (R,) the flat token index of
    each row (0 for padding rows).
    """
    B, T = assignment.shape
    dev = assignment.device
    same = assignment.unsqueeze(-1) == torch.arange(len(widths), device=dev)  # (B, T, Nr)
    rank = same.cumsum(1).gather(2, assignment.unsqueeze(-1)).squeeze(-1) - 1  # (B, T) among same depth
    starts = torch.tensor([B * sum(widths[:d]) for d in range(len(widths))], device=dev)  # (Nr,)
    first = starts + torch.arange(B, device=dev).unsqueeze(1) * torch.tensor(widths, device=dev)  # (B, Nr)
    src = (first.gather(1, assignment) + rank).reshape(-1)  # (B*T,)
    rev = torch.zeros(B * sum(widths), dtype=torch.long, device=dev)  # (R,)
    return src, rev.scatter_(0, src, torch.arange(B * T, device=dev))


def _run_recursion(model, r, rec, x, pos, store, valid):
    """Shared layers of recursion r on packed x: (B, k, C) at positions pos (B, k); valid
    (B, k) marks the running rows (the rest pad). KV strategies: ``kv_sharing.run_kv_layer``
    over the recursion-1 KV in ``store``."""
    start = len(model.plan.prefix) + r * len(rec)  # effective index of the recursion's first layer
    for j, layer_id in enumerate(rec):
        x = run_kv_layer(model, start + j, layer_id, x, pos, r, store, valid=valid)  # (B, k, C)
    return model.end_recursion(r, x)  # (B, k, C) recursion PE relaxation hook


def run_token_choice(model, h: torch.Tensor, positions: torch.Tensor, trace, max_depth: int | None = None):
    """h: (B, T, C) after the prefix layers -> (h, weighted router loss). Fills ``trace``.

    ``max_depth``: a token whose router chose a deeper depth stops after recursion
    max_depth (its gate g stays that of the depth it chose)."""
    B, T, _ = h.shape  # batch, tokens, channels
    rcfg = model.cfg.router
    Nr = model.cfg.num_recursions
    router = model.routers[0]
    warmup = model.training and model.capacity_scale < 1.0
    depths = model.router_kind.token_depths(model, h, warmup=warmup, max_depth=max_depth)  # the kind's decision
    logits, scores, probs, choice = depths.logits, depths.scores, depths.probs, depths.choice  # (B, T, Nr) / (B, T)
    assignment = depths.depth_id  # (B, T) depth - 1 each token runs

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
        active = decide(model, r, h, reached, depths=depths).keep  # (B, T) assignment >= r
        trace.selected.append(active)
        trace.candidates.append(reached)
        trace.causal_keep.append(active)  # the training decision is already causal
        trace.scores.append(rcfg.alpha * scores[..., r].detach())  # (B, T) weight if d_t = r+1
        reached = active

    # recursion 1: every token, original order (recursion 1's K/V are what 'shared' reuses)
    h1, x = h, h
    store: dict = {}  # producer layer -> its (k, v, positions): recursion 1's, for KV sharing
    for j, layer_id in enumerate(model.plan.recursions[0]):
        x = run_kv_layer(model, len(model.plan.prefix) + j, layer_id, x, positions, 0, store)  # (B, T, C)
    x = model.end_recursion(0, x)  # (B, T, C) recursion PE relaxation hook

    # recursions 2..Nr on packed blocks; a token's final state stays in the block where it stopped
    run_max, run_total, stop_max = depth_counts(assignment, Nr)
    slots = torch.arange(T, device=h.device).expand(B, T)  # (B, w) original token index of each row
    count = torch.full((B,), T, device=h.device)  # (B,) valid rows of the block; the rest is padding
    depth = assignment  # (B, w) depth - 1 of the token in each row
    stopped: list[torch.Tensor] = []  # (B, stop_max[d], C) rows of the tokens with depth - 1 == d
    for r, rec in enumerate(model.plan.recursions[1:], start=1):
        k = run_max[r]
        if stop_max[r - 1]:  # some token stopped after recursion r-1: set its row aside
            x, done, run, count = split_block(x, depth, r, k, stop_max[r - 1])
            stopped.append(done)
            slots, depth = slots.gather(1, run), depth.gather(1, run)  # (B, k)
        if k == 0:
            break
        valid = torch.arange(k, device=h.device) < count.unsqueeze(1)  # (B, k)
        pos = positions.gather(1, slots)  # (B, k)
        x = _run_recursion(model, r, rec, x, pos, store, valid)  # (B, k, C)
    if stopped:  # (B, T, C) original order
        blocks, pad = stopped, None
        if stop_max[-1]:  # the last recursion ran: its block is a layer output, its padding needs zero gradient
            blocks, n_pad = [*stopped, x], B * k - run_total[-1]
            pad = torch.nonzero_static(~valid.reshape(-1), size=n_pad)[:, 0] if n_pad else None
        x = _Merge.apply(*final_rows(assignment, stop_max), pad, *blocks)

    out = gate(rcfg, h1, x, depths.g, relative=False)  # (B, T, C) routing.py
    trace.probs = probs.detach()
    trace.assignment = assignment
    return out, aux
