"""Router losses for MoR (Mixture-of-Recursions, arXiv 2507.10524), as pure torch functions.

* ``router_z_loss``            -- App. G.1, Zoph et al. (2022):  L_z = (1/B) sum_i (logsumexp_j x_j^(i))^2
* ``expert_choice_aux_bce``    -- expert-choice auxiliary loss: BCE(router logit, top-k membership)
* ``token_choice_balance_loss`` -- token-choice Switch-style balancing loss  Nr * sum_i f_i * P_i
* ``loss_free_bias_update``    -- token-choice loss-free balancing (DeepSeek; Wang et al., 2024)

All losses are computed in float32 (inputs may be bf16) and return 0-dim tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "expert_load",
    "router_z_loss",
    "expert_choice_aux_bce",
    "token_choice_balance_loss",
    "loss_free_bias_update",
    "bias_step_from_load",
]


def _check_assignment(assignment: Tensor, n_experts: int, name: str = "assignment") -> Tensor:
    """Validate integer expert ids in [0, n_experts); return them flattened, shape (N,)."""
    if n_experts < 1:
        raise ValueError(f"n_experts must be >= 1, got {n_experts}")
    if assignment.dtype.is_floating_point or assignment.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of expert ids, got {assignment.dtype}")
    flat = assignment.reshape(-1)
    if flat.numel() == 0:
        raise ValueError(f"{name} is empty")
    if int(flat.min()) < 0 or int(flat.max()) >= n_experts:
        raise ValueError(f"{name} values must lie in [0, {n_experts}), got "
                         f"[{int(flat.min())}, {int(flat.max())}]")
    return flat.long()


def expert_load(assignment: Tensor, n_experts: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Tokens per expert, shape (n_experts,), from validated ids (``_check_assignment``).

    ``torch.bincount``'s counts, written as a scatter-add into a tensor of fixed shape: bincount's
    output length is data-dependent (max(minlength, max id + 1)), which fake tensors cannot give a
    shape to, so the rehearsal's token-choice train jobs failed there (docs/rehearsal.md). Exact
    in float32 up to 2**24 tokens a batch."""
    return torch.zeros(n_experts, dtype=dtype, device=assignment.device).scatter_add_(
        0, assignment, torch.ones_like(assignment, dtype=dtype))


def router_z_loss(logits: Tensor, *, per_token_scalar: bool = False, mask: Tensor | None = None) -> Tensor:
    """Router z-loss (App. G.1):  L_z(x) = (1/B) * sum_{i=1..B} ( log sum_{j=1..Nr} exp(x_j^(i)) )^2.

    Shapes:
      * default: ``logits`` is (..., Nr); the last dim holds the Nr expert logits of one token
        and all leading dims are flattened into the B tokens (token-choice routers).
        A 1-D input is rejected as ambiguous -- reshape it to (B, 1) or (1, Nr).
      * ``per_token_scalar=True``: every element is the single logit of one token (expert-choice
        routers emit ONE scalar per token per recursion, any shape, e.g. (B,) or (batch, seq)).
        logsumexp over one logit is the logit itself, so L_z = mean(x^2). Passing (..., 1)
        without the flag gives the same value.

    ``mask``: optional bool, one entry per token (the shape of ``logits``, less the Nr dim
    unless ``per_token_scalar``): the mean runs over the True tokens only. Equals
    ``router_z_loss(logits[mask])`` without boolean indexing, whose data-dependent shape
    costs a host sync and a copy; an all-False mask gives NaN (0/0) instead of an error.
    """
    if per_token_scalar:
        logits = logits.reshape(-1, 1)  # (B, 1)
    elif logits.dim() < 2:
        raise ValueError(f"logits must have shape (..., Nr) with at least 2 dims, got "
                         f"{tuple(logits.shape)}; pass per_token_scalar=True for one logit per token")
    if logits.numel() == 0:
        raise ValueError("logits is empty")
    x = logits.float().reshape(-1, logits.shape[-1])  # (B, Nr)
    # logsumexp over a single logit is the logit itself: skip it (and its backward)
    lse = x.squeeze(-1) if x.shape[-1] == 1 else torch.logsumexp(x, dim=-1)  # (B,)
    return _mean(lse.pow(2), mask)  # scalar


def expert_choice_aux_bce(router_logits: Tensor, selected: Tensor, candidates: Tensor | None = None) -> Tensor:
    """Expert-choice auxiliary loss: mean_t BCE(sigmoid(z_t), 1[t in top-k]).

    ``router_logits``: pre-activation router outputs z, any shape (e.g. (batch, seq) for one
    recursion). ``selected``: bool top-k membership, same shape (used as a constant target).
    Training z to predict top-k membership lets inference replace the non-causal top-k by the
    causal per-token decision ``sigmoid(z) > 0.5`` (i.e. ``z > 0``). Mean over all tokens, or
    over the True entries of the optional bool ``candidates`` (same shape): equal to
    ``expert_choice_aux_bce(router_logits[candidates], selected[candidates])`` without the
    boolean indexing (host sync, copies); an all-False mask gives NaN instead of an error.
    """
    if router_logits.shape != selected.shape:
        raise ValueError(f"selected shape {tuple(selected.shape)} != router_logits shape "
                         f"{tuple(router_logits.shape)}")
    if selected.dtype != torch.bool:
        raise ValueError(f"selected must be a bool tensor, got {selected.dtype}")
    if router_logits.numel() == 0:
        raise ValueError("router_logits is empty")
    target = selected.to(torch.float32).detach()
    if candidates is None:
        return F.binary_cross_entropy_with_logits(router_logits.float(), target, reduction="mean")
    loss = F.binary_cross_entropy_with_logits(router_logits.float(), target, reduction="none")
    return _mean(loss, candidates)


def _mean(values: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of float32 ``values``, over the entries where bool ``mask`` (same numel) is True."""
    if mask is None:
        return values.mean()
    if mask.dtype != torch.bool or mask.numel() != values.numel():
        raise ValueError(f"mask must be a bool tensor with {values.numel()} entries, got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    m = mask.reshape(values.shape).to(values.dtype)
    return (values * m).sum() / m.sum()


def token_choice_balance_loss(probs: Tensor, assignment: Tensor, n_experts: int) -> Tensor:
    """Switch-style balancing loss:  L_bal = Nr * sum_{i=1..Nr} f_i * P_i.

    f_i = fraction of the N tokens whose top-1 expert is i (no gradient),
    P_i = mean router probability for expert i (carries the gradient).
    ``probs``: (N, Nr) (leading dims are flattened); ``assignment``: (N,) long expert ids
    in [0, Nr). Equals 1.0 for perfectly uniform routing.
    """
    if n_experts < 1:
        raise ValueError(f"n_experts must be >= 1, got {n_experts}")
    if probs.dim() < 2 or probs.shape[-1] != n_experts:
        raise ValueError(f"probs must have shape (N, {n_experts}), got {tuple(probs.shape)}")
    if assignment.shape != probs.shape[:-1]:
        raise ValueError(f"assignment shape {tuple(assignment.shape)} != probs leading shape "
                         f"{tuple(probs.shape[:-1])}")
    a = _check_assignment(assignment, n_experts)                            # (N,)
    p = probs.float().reshape(-1, n_experts)                                # (N, Nr)
    f = expert_load(a, n_experts, p.dtype) / a.numel()                      # (Nr,)
    P = p.mean(dim=0)                                                       # (Nr,)
    return n_experts * (f * P).sum()


@torch.no_grad()
def loss_free_bias_update(bias: Tensor, assignment: Tensor, n_experts: int, rate: float) -> Tensor:
    """Loss-free balancing bias step (DeepSeek):  b_i <- b_i + u * sign(mean_load - load_i).

    ``bias``: (Nr,) per-expert bias added to router scores for top-1 *selection* only;
    ``assignment``: top-1 expert ids of the batch's tokens, any shape; ``rate``: u >= 0.
    Over-loaded experts are pushed down, under-loaded up, exactly balanced ones unchanged.
    Returns a new tensor (the input is not modified); no gradient.
    """
    if bias.shape != (n_experts,):
        raise ValueError(f"bias must have shape ({n_experts},), got {tuple(bias.shape)}")
    if rate < 0:
        raise ValueError(f"rate must be >= 0, got {rate}")
    a = _check_assignment(assignment, n_experts)                            # (N,)
    return bias_step_from_load(bias, expert_load(a, n_experts), rate)


@torch.no_grad()
def bias_step_from_load(bias: Tensor, load: Tensor, rate: float) -> Tensor:
    """``loss_free_bias_update`` from the tokens per expert (``load``: (Nr,), any numeric dtype)
    instead of the ids: b_i + u * sign(mean load - load_i). The router accumulates loads over a
    step's micro-batches (and ranks) and steps from them; no load at all moves nothing."""
    if bias.shape != load.shape:
        raise ValueError(f"bias {tuple(bias.shape)} and load {tuple(load.shape)} must match")
    if rate < 0:
        raise ValueError(f"rate must be >= 0, got {rate}")
    load = load.to(torch.float32)
    mean_load = load.sum() / load.numel()
    step = torch.sign(mean_load - load) * (load.sum() > 0)
    return bias + rate * step.to(device=bias.device, dtype=bias.dtype)
