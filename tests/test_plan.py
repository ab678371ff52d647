"""The plan's cost models beyond training (mor.launch.plan): the capped forward of the depth_cap
analysis (mor.flops), lm-eval, analysis and throughput jobs, and which runs get them."""

from __future__ import annotations

import pytest

from mor.config import ModelConfig, RouterConfig, capacities, load_scales
from mor.flops import (capped_forward_flops_per_token, forward_flops_per_token, layer_params, plan_for,
                       recursion_flops_per_token, router_params)

SCALES = load_scales()


# ------------------------------------------------------------------ mor.flops: the depth-capped forward
def _unshared(cfg: ModelConfig, vocab: int, T: int) -> float:
    """The unshared first/last layers and the LM head, counted by hand (PaLM's 2P + 4CT per layer)."""
    s = SCALES[cfg.scale]
    plan = plan_for(cfg, s)
    per_layer = 2 * (layer_params(s) - 2 * s.hidden) + 4 * s.hidden * T
    return (len(plan.prefix) + len(plan.suffix)) * per_layer + 2 * s.hidden * vocab


def test_capped_forward_of_a_recursive_model_counts_the_recursions_it_runs():
    cfg = ModelConfig(scale="135M", variant="recursive", tying="middle_cycle", num_recursions=3)
    s, T, vocab = SCALES["135M"], 2048, 49152
    per_layer = 2 * (layer_params(s) - 2 * s.hidden) + 4 * s.hidden * T
    per_rec = len(plan_for(cfg, s).recursions[0]) * per_layer  # every token runs every recursion
    assert recursion_flops_per_token(cfg, s, T) == pytest.approx([per_rec] * 3)
    for d in (1, 2, 3):
        assert capped_forward_flops_per_token(cfg, s, vocab, T, d) == pytest.approx(_unshared(cfg, vocab, T) + d * per_rec)
    assert capped_forward_flops_per_token(cfg, s, vocab, T, 3) == pytest.approx(forward_flops_per_token(cfg, s, vocab, T))
    with pytest.raises(ValueError, match="max_depth must lie in 1..3"):
        capped_forward_flops_per_token(cfg, s, vocab, T, 4)


def test_capped_forward_of_expert_choice_mor_drops_deeper_recursions_and_their_routers():
    cfg = ModelConfig(scale="360M", variant="mor", tying="middle_cycle", num_recursions=4,
                      router=RouterConfig(type="expert_choice"))
    s, T, vocab = SCALES["360M"], 2048, 49152
    mm, attn = 2 * (layer_params(s) - 2 * s.hidden), 4 * s.hidden * T
    n = len(plan_for(cfg, s).recursions[0])
    router = 2 * router_params(cfg, s) / 4  # one of the Nr router heads per recursion
    want = [n * (c * mm + c * c * attn) + router for c in capacities(4)]  # recursion-wise KV: c^2 attention
    assert recursion_flops_per_token(cfg, s, T) == pytest.approx(want)
    assert _unshared(cfg, vocab, T) + sum(want) == pytest.approx(forward_flops_per_token(cfg, s, vocab, T))
    assert capped_forward_flops_per_token(cfg, s, vocab, T, 2) == pytest.approx(_unshared(cfg, vocab, T) + sum(want[:2]))


def test_token_choice_router_runs_once_before_the_recursions():
    cfg = ModelConfig(scale="135M", variant="mor", tying="middle_cycle", num_recursions=3,
                      router=RouterConfig(type="token_choice"))
    s, T, vocab = SCALES["135M"], 2048, 49152
    rest = forward_flops_per_token(cfg, s, vocab, T) - sum(recursion_flops_per_token(cfg, s, T))
    assert rest == pytest.approx(_unshared(cfg, vocab, T) + 2 * router_params(cfg, s))
