"""Every parameter a table counts is one the model trains.

For every distinct model of the grids behind tables 10-16 (rebuilt at the `tiny` scale),
one forward + backward after perturbing all weights (so LoRA's zero-initialised B does not
hide A's gradient): every parameter that ``num_params`` counts receives a non-zero
gradient, every parameter it leaves out (``unused_parameter_names``) receives none, and the
pure formula ``mor.flops.param_count`` equals the model's count. The gradient is the
independent witness: the structural rule (mor.model.tying.kv_unused) is never consulted
to decide what got a gradient.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mor.config import load_scales
from mor.flops import param_count
from mor.grids import grid_path, load_grid
from mor.model.transformer import build_model

TINY = load_scales()["tiny"]
V = 64
GRIDS = ("table10", "table12", "table13", "table14", "table15", "table16")


def _models():
    seen = {}
    for g in GRIDS:
        for run in load_grid(grid_path(g), "local").runs:
            m = dataclasses.replace(run.config.model, scale="tiny", init_checkpoint="", tied_init="random")
            seen.setdefault(repr(m), (f"{g}:{run.run_id}", m))
    return list(seen.values())


MODELS = _models()


@pytest.mark.parametrize("cfg", [m for _, m in MODELS], ids=[i for i, _ in MODELS])
def test_every_counted_parameter_gets_a_gradient(cfg):
    torch.manual_seed(0)
    model = build_model(cfg, TINY, V).train()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    idx = torch.randint(0, V, (2, 32))
    model(idx, targets=idx).loss.backward()
    unused = model.unused_parameter_names()
    named = dict(model.named_parameters())
    assert unused <= set(named)
    no_grad = sorted(n for n, p in named.items() if n not in unused and p.requires_grad
                     and (p.grad is None or not p.grad.abs().sum() > 0))
    assert no_grad == [], f"counted but never trained: {no_grad}"
    assert sorted(n for n in unused if named[n].grad is not None) == []
    frozen = sum(p.numel() for n, p in named.items() if not p.requires_grad and n not in unused)
    assert frozen == (cfg.num_recursions if cfg.router.type == "token_choice" and cfg.router.balancing == "loss_free"
                      and cfg.variant == "mor" else 0)  # only the loss-free balancing biases are frozen
    assert model.num_params() == param_count(cfg, TINY, V)


def test_unused_projections_are_found_where_expected():
    """Hand-derived cases: vanilla KV sharing in pairs (Cycle, 4 layers: layers 2, 3 read
    layers 0, 1) and Sequence tying Nr=2 over 4 layers (unique 0 0 | 1 1: recursion 2 reads
    recursion 1's KV at the same position, so unique layer 1 never computes its own)."""
    from mor.config import ModelConfig

    van = build_model(ModelConfig(scale="tiny", variant="vanilla", kv="shared", tying="cycle"), TINY, V)
    assert van.unused_parameter_names() == {f"unique_layers.{u}.self_attn.{p}_proj.weight" for u in (2, 3) for p in "kv"}
    seq = build_model(ModelConfig(scale="tiny", variant="recursive", kv="shared", tying="sequence", num_recursions=2),
                      TINY, V)
    assert seq.unused_parameter_names() == {f"unique_layers.1.self_attn.{p}_proj.weight" for p in "kv"}
    kv = 2 * TINY.hidden * TINY.kv_heads * TINY.head_dim
    full = sum(p.numel() for p in seq.parameters())
    assert seq.num_params() == full - kv
