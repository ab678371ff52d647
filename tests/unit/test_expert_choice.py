"""Expert-choice recursion (``run_expert_choice``) against the straightforward formulation
it replaced (gather / scatter, boolean-indexed router losses, a host sync for k): same
forward, same gradients, same routing trace."""

import pytest
import torch
import torch.nn.functional as F

from mor.capacity import capacities, tokens_kept
from mor.config import ModelConfig, RouterConfig, load_scales
from mor.model.expert_choice import run_expert_choice
from mor.model.kv_sharing import run_kv_layer
from mor.model.router import (
    add_rows,
    flat_rows,
    gather_tokens,
    scatter_tokens,
    select_topk,
    take_rows,
)
from mor.model.router_losses import expert_choice_aux_bce, router_z_loss
from mor.model.transformer import RoutingTrace, build_model

TINY = load_scales()["tiny"]


def reference_expert_choice(model, h, positions, trace):
    """The previous run_expert_choice: gather / scatter over (B, T, C), losses over the
    boolean-indexed candidates, k from the candidate counts (a host sync)."""
    B, T = h.shape[:2]
    rcfg = model.cfg.router
    caps = capacities(model.cfg.num_recursions, rcfg.capacity)
    active = torch.ones(B, T, dtype=torch.bool)
    aux = h.new_zeros((), dtype=torch.float32)
    kv_store: dict = {}
    for r, rec in enumerate(model.plan.recursions):
        router = model.routers[r]
        frac = caps[r] + (1.0 - caps[r]) * (1.0 - model.capacity_scale)
        k = min(tokens_kept(T, frac, rcfg.capacity_rounding), int(active.sum(1).min()))
        logits = router.head(h).squeeze(-1) / router.cfg.temperature
        causal = router.causal_logits(h, logits)
        weights = router.weights(logits)
        idx = select_topk(logits, active, k)
        selected = torch.zeros_like(active).scatter(1, idx, True)
        g = weights.gather(1, idx)
        h_sel = gather_tokens(h, idx)
        pos_sel = positions.gather(1, idx)
        out = h_sel
        for j, layer_id in enumerate(rec):
            e = len(model.plan.prefix) + r * len(rec) + j
            out = run_kv_layer(model, e, layer_id, out, pos_sel, r, kv_store)
        out = model.end_recursion(r, out)
        if rcfg.gating == "weighted" and rcfg.combine == "layer_output":  # the authors': h + g f(h)
            new = h_sel + g.unsqueeze(-1) * out
        elif rcfg.gating == "weighted":
            new = h_sel + g.unsqueeze(-1) * (out - h_sel)
        else:
            new = out + g.unsqueeze(-1)
        h = scatter_tokens(h, idx, new)
        if model.training:
            target = causal if router.aux_head is not None else logits
            aux = aux + rcfg.aux_weight * expert_choice_aux_bce(target[active], selected[active])
            if rcfg.z_loss_coeff:
                aux = aux + rcfg.z_loss_coeff * router_z_loss(logits[active], per_token_scalar=True)
        trace.selected.append(selected)
        trace.candidates.append(active)
        trace.scores.append(weights.detach())
        trace.causal_keep.append((causal.detach() > 0) & active)
        active = selected
    return h, aux


def run_with_grads(fn, model, h0, positions):
    """(out, aux, trace, grad of h, grads of the parameters) of one forward + backward."""
    model.zero_grad(set_to_none=True)
    h = h0.clone().requires_grad_(True)
    trace = RoutingTrace()
    out, aux = fn(model, h, positions, trace)
    (out.pow(2).sum() + out.sum() + 100 * aux).backward()  # non-uniform upstream gradient
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), aux.detach(), trace, h.grad, grads


CASES = {
    "weighted": {},
    "weighted_layer_update_ceil": {"router": RouterConfig(combine="layer_update", capacity_rounding="ceil",
                                                          aux_accum_steps=1)},
    "additive": {"router": RouterConfig(gating="additive", alpha=0.5)},
    "z_loss+temperature": {"router": RouterConfig(z_loss_coeff=0.01, temperature=0.7, func="tanh")},
    "aux_router": {"router": RouterConfig(aux="aux_router", arch="mlp")},
    "explicit_capacity": {"router": RouterConfig(capacity=(0.75, 0.5, 0.5))},  # recursion 1 routed too
    "kv_shared": {"kv": "shared"},
    "kv_shared_dagger": {"kv": "shared_dagger", "router": RouterConfig(gating="additive")},
    "recursion_pe": {"relaxation": "recursion_pe"},
    "lora": {"relaxation": "lora", "relaxation_rank": 2},
}


@pytest.mark.parametrize("warmup", [1.0, 0.3], ids=["no_warmup", "capacity_warmup"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference_forward_and_gradients(case, warmup):
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, **CASES[case])
    torch.manual_seed(0)
    model = build_model(cfg, TINY, 50).train()
    model.capacity_scale = warmup
    for p in model.parameters():  # relaxations start as the identity: give them an effect
        if p.requires_grad:
            p.data.add_(0.05 * torch.randn_like(p))
    B, T, C = 3, 11, TINY.hidden
    h0 = torch.randn(B, T, C)
    positions = torch.arange(T).expand(B, T)
    ref = run_with_grads(reference_expert_choice, model, h0, positions)
    new = run_with_grads(run_expert_choice, model, h0, positions)
    torch.testing.assert_close(new[0], ref[0])
    torch.testing.assert_close(new[1], ref[1])
    for name in ("selected", "candidates", "scores", "causal_keep"):
        for a, b in zip(getattr(new[2], name), getattr(ref[2], name), strict=True):
            torch.testing.assert_close(a, b)
    torch.testing.assert_close(new[3], ref[3])
    assert new[4].keys() == ref[4].keys()
    for name in ref[4]:
        torch.testing.assert_close(new[4][name], ref[4][name], msg=name)


def test_row_helpers_match_gather_and_scatter():
    torch.manual_seed(1)
    B, T, C, k = 4, 9, 5, 6
    x = torch.randn(B, T, C)
    idx = torch.rand(B, T).topk(k, dim=1).indices.sort(dim=1).values  # (B, k)
    flat = flat_rows(idx, T)
    torch.testing.assert_close(take_rows(x, flat), gather_tokens(x, idx), rtol=0, atol=0)
    torch.testing.assert_close(take_rows(x[..., 0], flat), gather_tokens(x[..., 0], idx), rtol=0, atol=0)
    new = torch.randn(B, k, C)
    got = add_rows(x, flat, new - take_rows(x, flat))
    torch.testing.assert_close(got, scatter_tokens(x, idx, new))


def test_masked_router_losses_equal_boolean_indexing():
    torch.manual_seed(2)
    z = (3 * torch.randn(5, 17)).requires_grad_(True)
    selected = torch.rand(5, 17) > 0.5
    mask = torch.rand(5, 17) > 0.3
    for got, want in [
        (expert_choice_aux_bce(z, selected, mask), expert_choice_aux_bce(z[mask], selected[mask])),
        (router_z_loss(z, per_token_scalar=True, mask=mask), router_z_loss(z[mask], per_token_scalar=True)),
        (router_z_loss(z.view(5, 17, 1), mask=mask), router_z_loss(z[mask].view(-1, 1))),
    ]:
        torch.testing.assert_close(got, want)
        g_got, = torch.autograd.grad(got, z)
        g_want, = torch.autograd.grad(want, z)
        torch.testing.assert_close(g_got, g_want)
    many = torch.randn(5, 17, 4)  # Nr = 4 logits per token, one mask entry per token
    torch.testing.assert_close(router_z_loss(many, mask=mask), router_z_loss(many[mask]))
    torch.testing.assert_close(expert_choice_aux_bce(z, selected, torch.ones_like(mask)),
                               F.binary_cross_entropy_with_logits(z, selected.float()))
    with pytest.raises(ValueError, match="mask"):
        router_z_loss(many, mask=mask.float())
