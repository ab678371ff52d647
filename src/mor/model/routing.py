"""The routing decision and the gate: the one place that says which tokens continue at
recursion r, and how a recursion's output is mixed back into the token's state.

Every path calls these two: training (expert_choice.py, token_choice.py), evaluation and
cached decoding (decode.py), and the batching engine (mor.engine).

    decide(model, r, h, active, ...)   which tokens run recursion r (0-based):
        expert-choice, policy 'topk'    the k highest router logits among the candidates of
                                        each sequence (training, teacher-forced scoring); not
                                        causal: it looks at the whole sequence
        expert-choice, policy 'causal'  keep_r(t) = active(t) and causal_logit_r(h_t) > 0
                                        (the decision the aux loss / aux router trains; a
                                        recursion of capacity 1 keeps every candidate, as
                                        its top-k does)
        token-choice                    active(t) and depth(t) > r, the depth chosen once
                                        before recursion 1 (``token_depths``); causal as trained

    gate(router_cfg, x0, out, g, ...)  the state after a recursion (expert-choice, per
                                        recursion) or after the whole stack (token-choice):
        weighted, expert-choice, combine 'layer_output'   x0 + g * out   (the authors')
        weighted, expert-choice, combine 'layer_update'   x0 + g * (out - x0)
        weighted, absolute (token-choice)    x0 + g * out       (x0 = state entering the stack)
        additive                             out + g
        g None                               out                (token-choice between recursions)
    ``out`` is the recursion block's output, its residual connections included, so
    'layer_output' is the paper's H^{r+1} = g * f(H^r) + H^r with f the whole block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mor.capacity import capacities
from mor.model.router import select_topk


# --------------------------------------------------------------------------------------
# Token-choice: the depth of every token, chosen once before recursion 1
# --------------------------------------------------------------------------------------
@dataclass
class TokenDepths:
    """Token-choice routing state for tokens (B, T)."""

    h1: torch.Tensor  # (B, T, C) state entering the recursion stack (the gate's x0)
    depth_id: torch.Tensor  # (B, T) long, depth - 1 the token runs (after warm-up / cap)
    g: torch.Tensor  # (B, T) router weight alpha * score of the chosen depth
    logits: torch.Tensor | None = None  # (B, T, Nr) router logits (training losses)
    probs: torch.Tensor | None = None  # (B, T, Nr) selection probabilities
    scores: torch.Tensor | None = None  # (B, T, Nr) f(logits) without alpha
    choice: torch.Tensor | None = None  # (B, T) router's top-1 before warm-up / cap

    def rows(self, idx) -> "TokenDepths":
        """The state of some tokens: ``idx`` indexes dim 1 (a slice, e.g. the last token)."""
        return TokenDepths(self.h1[:, idx], self.depth_id[:, idx], self.g[:, idx])


def token_depths(model, h: torch.Tensor, *, warmup: bool = False, max_depth: int | None = None) -> TokenDepths:
    """Token-choice decision for states h (B, T, C) entering the recursion stack.

    ``warmup`` (training balancing warm-up): every token runs all Nr recursions, g is that
    of depth Nr. ``max_depth`` caps the depth run (g stays that of the chosen depth)."""
    nr = model.cfg.num_recursions
    router = model.routers[0]
    logits = router.logits(h)  # (B, T, Nr)
    scores = router.scores(logits)  # (B, T, Nr)
    probs = router.probs(logits, scores)  # (B, T, Nr)
    choice = router.choose(probs)  # (B, T) expert id = depth - 1
    depth_id = torch.full_like(choice, nr - 1) if warmup else choice  # (B, T)
    g = model.cfg.router.alpha * scores.gather(-1, depth_id.unsqueeze(-1)).squeeze(-1)  # (B, T)
    if max_depth is not None and max_depth < nr:
        depth_id = depth_id.clamp(max=max_depth - 1)  # (B, T) test-time depth cap
    return TokenDepths(h, depth_id, g, logits, probs, scores, choice)


def depths_up_front(model) -> bool:
    """Whether the model's router kind chooses every token's depth before recursion 1
    (token-choice) rather than deciding at each recursion (expert-choice); False without routers."""
    return bool(model.routers) and not model.router_kind.per_recursion


# --------------------------------------------------------------------------------------
# The decision at recursion r
# --------------------------------------------------------------------------------------
@dataclass
class Decision:
    """Which tokens run recursion r, and their router weight.

    keep: (B, T) bool. idx: (B, k) ascending token indices of the kept tokens when the
    policy is 'topk' and it dropped some (None otherwise). g: (B, T) router weight (None
    for token-choice, which gates once after the stack). logits / causal: (B, T) router
    logits and the logits whose sign is the causal decision (expert-choice; training losses).
    """

    keep: torch.Tensor
    g: torch.Tensor | None
    idx: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    causal: torch.Tensor | None = None


def decide(model, r: int, h: torch.Tensor, active: torch.Tensor, *, policy: str = "causal",
           k: int | None = None, n_active: int | None = None, depths: TokenDepths | None = None) -> Decision:
    """The tokens of h (B, T, C) that run recursion r, among the candidates ``active`` (B, T).

    policy 'topk' (expert-choice training): keep k per sequence; ``n_active`` = candidates
    per sequence (T: every token is one, no masking needed; k == T keeps all, no top-k).
    policy 'causal' (inference): the per-token decision, any number per sequence.
    Token-choice (``depths`` given): the depth chosen up front, whatever the policy.
    """
    if depths is not None:
        return Decision(active & (depths.depth_id >= r), None)
    if policy not in ("topk", "causal"):
        raise ValueError(f"routing policy {policy!r}; choose 'topk' or 'causal'")
    router = model.routers[r]
    logits = router.logits(h)  # (B, T)
    causal = router.causal_logits(h, logits)  # (B, T) sign = inference-time decision
    g = router.weights(logits)  # (B, T) g for every token
    if policy == "causal":
        if capacities(model.cfg.num_recursions, model.cfg.router.capacity)[r] >= 1:
            return Decision(active, g, None, logits, causal)  # full capacity: top-k keeps every candidate
        return Decision(active & (causal > 0), g, None, logits, causal)
    T = h.shape[1]
    if k == T:  # every token kept (hierarchical recursion 1): no top-k
        return Decision(active, g, None, logits, causal)
    idx = select_topk(logits, None if n_active == T else active, k)  # (B, k) ascending positions
    keep = torch.zeros_like(active).scatter(1, idx, True)  # (B, T)
    return Decision(keep, g, idx, logits, causal)


# --------------------------------------------------------------------------------------
# The gate
# --------------------------------------------------------------------------------------
class _WeightedGate(torch.autograd.Function):
    """out = x0 + gate * x with gate (B, T). The backward passes grad on to x0 as it is and
    computes grad * gate and the per-token dot product <grad, x>, one pass each; addcmul's
    own backward spends extra full passes multiplying by its scalar value (1)."""

    @staticmethod
    def forward(ctx, x0, gate, x):
        ctx.save_for_backward(gate, x)
        return torch.addcmul(x0, gate.unsqueeze(-1), x)  # (B, T, C)

    @staticmethod
    def backward(ctx, grad):
        gate, x = ctx.saved_tensors
        grad_gate = torch.linalg.vecdot(grad, x) if ctx.needs_input_grad[1] else None  # (B, T)
        grad_x = grad * gate.unsqueeze(-1) if ctx.needs_input_grad[2] else None  # (B, T, C)
        return grad, grad_gate, grad_x


def gate(router_cfg, x0: torch.Tensor, out: torch.Tensor, g: torch.Tensor | None, *,
         relative: bool = True, delta: bool = False) -> torch.Tensor:
    """Gated state of tokens x0 (B, k, C) whose recursion output is ``out`` (B, k, C), router
    weight g (B, k), under ``router_cfg`` (mor.config.RouterConfig: gating, combine; formulas:
    module docstring). ``relative`` False: token-choice's gate after the stack. ``delta``:
    return the gated state minus x0 (written back by adding it to the rows of the full state;
    expert-choice only)."""
    gating = router_cfg.gating
    if g is None:
        return out - x0 if delta else out
    if gating == "weighted" and (not relative or router_cfg.combine == "layer_output"):
        if delta:
            return g.unsqueeze(-1).to(out.dtype) * out  # (B, k, C)
        return _WeightedGate.apply(x0, g.to(out.dtype), out)  # (B, k, C)
    g = g.unsqueeze(-1).to(out.dtype)  # (B, k, 1)
    if gating == "weighted":  # combine 'layer_update'
        return g * (out - x0) if delta else x0 + g * (out - x0)
    if gating == "additive":
        return out + g - x0 if delta else out + g
    raise ValueError(f"router gating {gating!r}; choose 'weighted' or 'additive'")
