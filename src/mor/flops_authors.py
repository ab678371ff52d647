"""The authors' FLOP convention: how a FLOPs budget became their ``num_train_steps`` (issue 55).

Derived from the data, not from their code (their repository holds no FLOP counter): the nine
released 360M configurations (``src/mor/authors/released.yaml``, from their
``conf/pretrain/250720_pretrain_smollm-360m_*.yaml``) train 16.5e18 FLOPs at 1,024 x 2,048 tokens
a step, and their step counts follow from this count, per token of one **forward** pass:

    layer call   2 x (4 d^2 + 3 d m)        q, k, v, o projections d x d each (GQA ignored:
                                            k and v counted at full width) + SwiGLU's 3 d x m
    attention    2 d T                      QK^T and AV (2 x 2 d FLOPs per key) over the T / 2
                                            keys a causal query sees on average
    not counted  embeddings, LM head, norms, routers, the backward pass

A recursion that a share c of the tokens reaches (expert-choice capacity (Nr - r + 1) / Nr, exact,
not floored to whole tokens; token-choice the same balanced shares) costs c x the layer calls and
c^2 x the attention (c T queries over c T keys); under recursive KV sharing a recursion r > 1 runs
no K and V projections (-4 d^2 of the 2 x 4 d^2) and its c T queries read all T keys (c x attention).

    steps      = round(budget / (F x tokens_per_step))                 (round half to even)
    save step  = round(0.8 x budget_b / (F x tokens_per_step))         their fixed_save_steps
    decay      = round(0.2 x steps)                                    their num_decay_steps

This gives seven of the nine released step counts exactly. The two MoR-3 runs (expert- and
token-choice, the same count) come out at 14,160.01 and were released as 14,161: one step more,
unexplained by any rounding rule tried (floor, ceil, whole-token capacities int/round/ceil,
router FLOPs, causal T(T+1)/2). Their fixed save steps 1,373 / 3,433 / 11,328 follow from the same
14,160.01 (0.8 x 14,160.01 = 11,328.0), so the float count is theirs and the last step is an
edit of the released number; ``tests/unit/test_authors_convention.py`` allows exactly that one step.

Our own count (``mor.flops.train_flops``: 3 x forward, embeddings, head, GQA widths, routers) is
what a run really spends; the plan prints it beside the budget (docs/isoflop.md).
"""

from __future__ import annotations

from mor.config import ModelConfig, ScaleShape
from mor.flops import counting


def authors_forward_flops_per_token(cfg: ModelConfig, s: ScaleShape, seq_len: int) -> float:
    """Forward FLOPs per token in the authors' convention (module docstring): layer calls with
    d x d attention projections and causal attention, no embeddings, head, norms or routers."""
    c = counting(cfg, s.layers)
    plan, producers = c.plan, c.producers
    d, m = s.hidden, s.mlp
    layer = 2 * (4 * d * d + 3 * d * m)
    kv_proj = 2 * 2 * d * d  # K and V projections, d x d each
    attn = 2 * d * seq_len
    flops = (len(plan.prefix) + len(plan.suffix)) * (layer + attn)
    e = len(plan.prefix)
    for r, (share, rec) in enumerate(zip(c.shares, plan.recursions)):
        for _ in rec:
            reads_kv = producers[e] != e and cfg.kv in ("shared", "shared_dagger")
            mm = layer - kv_proj if reads_kv and cfg.kv == "shared" else layer
            keys = share if (r > 0 and cfg.kv != "recursion_wise") else share * share
            flops += share * mm + keys * attn
            e += 1
    return float(flops)


def authors_steps_float(cfg: ModelConfig, s: ScaleShape, seq_len: int, tokens_per_step: int, budget: float) -> float:
    """Optimizer steps a budget buys in the authors' convention, before rounding."""
    return budget / (authors_forward_flops_per_token(cfg, s, seq_len) * tokens_per_step)


def authors_steps(cfg: ModelConfig, s: ScaleShape, seq_len: int, tokens_per_step: int, budget: float) -> int:
    """The step count a budget becomes: the nearest whole step (their ``num_train_steps``)."""
    return round(authors_steps_float(cfg, s, seq_len, tokens_per_step, budget))


def save_step(cfg: ModelConfig, s: ScaleShape, seq_len: int, tokens_per_step: int, budget: float,
              stable_frac: float = 0.8) -> int:
    """Their ``fixed_save_steps`` entry for a budget: the end of its warmup-stable part, rounded
    from the unrounded step count (0.8 x 9,438.15 = 7,550.5 -> 7,551 for Vanilla at 16.5e18)."""
    return round(stable_frac * authors_steps_float(cfg, s, seq_len, tokens_per_step, budget))


def decay_steps(steps: int, decay_frac: float = 0.2) -> int:
    """Their ``num_decay_steps``: the linear decay's length, the nearest whole step to 20 %."""
    return round(decay_frac * steps)
