"""Parameter counts and FLOPs as pure functions (no torch), shared by logs, isoFLOP planning
and the throughput memory model.

Derivation (PaLM, Chowdhery et al. 2022, App. B; nanoGPT ``estimate_mfu``): a matmul with a
weight of P parameters costs 2P FLOPs per token forward and 4P backward, so 6P per trained
token. Attention adds, per layer and token, 2*T*d for QK^T and 2*T*d for AV forward
(x3 for training): 12*d*T per layer per token, counting the full T like PaLM (no causal
halving). For a recursion that only a fraction c of the tokens enters (MoR expert-choice,
capacity c), the matmul term scales by c and the attention term by c^2 (c*T queries each
attending to c*T keys), matching PAPER.md's (k/N_ctx)^2 for recursion-wise caching.
"""

from __future__ import annotations

from mor.config import ModelConfig, ScaleShape, capacities
from mor.model.tying import TyingPlan, effective_depth, reduced_depth, tying_plan, vanilla_plan


def layer_params(s: ScaleShape) -> int:
    """One decoder layer: q,k,v,o projections + SwiGLU (3 matrices) + 2 RMSNorm gains."""
    kv = s.kv_heads * s.head_dim
    attn = s.hidden * s.hidden * 2 + s.hidden * kv * 2  # q, o: C*C; k, v: C*kv
    mlp = 3 * s.hidden * s.mlp
    return attn + mlp + 2 * s.hidden


def router_params(cfg: ModelConfig, s: ScaleShape) -> int:
    if cfg.variant != "mor":
        return 0
    r = cfg.router
    out = 1 if r.type == "expert_choice" else cfg.num_recursions
    heads = cfg.num_recursions if r.type == "expert_choice" else 1
    if r.arch == "linear":
        one = s.hidden * out
    else:
        width = s.hidden if r.arch == "mlp" else 4 * s.hidden
        one = s.hidden * width + width * out
    n_heads = heads * (2 if r.type == "expert_choice" and r.aux == "aux_router" else 1)
    return n_heads * one


def plan_for(cfg: ModelConfig, s: ScaleShape) -> TyingPlan:
    if cfg.variant == "vanilla":
        return vanilla_plan(reduced_depth(s.layers, cfg.num_recursions) if cfg.reduced else s.layers)
    return tying_plan(cfg.tying, effective_depth(cfg.tying, s.layers, cfg.num_recursions), cfg.num_recursions)


def param_count(cfg: ModelConfig, s: ScaleShape, vocab: int) -> int:
    """Unique parameters: tied embedding/head once, each unique layer once, final norm."""
    plan = plan_for(cfg, s)
    return vocab * s.hidden + plan.num_unique * layer_params(s) + s.hidden + router_params(cfg, s)


def forward_flops_per_token(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int) -> float:
    """Forward FLOPs per input token, averaged over the sequence (see module docstring)."""
    plan = plan_for(cfg, s)
    per_layer_mm = 2 * (layer_params(s) - 2 * s.hidden)
    per_layer_attn = 4 * s.hidden * seq_len
    unrouted = len(plan.prefix) + len(plan.suffix)
    flops = unrouted * (per_layer_mm + per_layer_attn)
    if cfg.variant == "mor" and cfg.router.type == "expert_choice":
        fracs = capacities(cfg.num_recursions, cfg.router.capacity)
    else:
        fracs = [1.0] * len(plan.recursions)
    for frac, rec in zip(fracs, plan.recursions):
        flops += len(rec) * (frac * per_layer_mm + frac * frac * per_layer_attn)
    flops += 2 * router_params(cfg, s)
    flops += 2 * s.hidden * vocab  # LM head
    return float(flops)


def train_flops(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int, tokens: int) -> float:
    """Training FLOPs: forward + backward (2x forward) over ``tokens`` tokens."""
    return 3.0 * forward_flops_per_token(cfg, s, vocab, seq_len) * tokens


def tokens_for_budget(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int, flops: float) -> int:
    """Training tokens that spend ``flops`` (isoFLOP planning)."""
    return int(flops / (3.0 * forward_flops_per_token(cfg, s, vocab, seq_len)))
