import contextlib

import pytest
import torch

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.flops import param_count
from mor.model.transformer import build_model

SCALES = load_scales()


@pytest.mark.parametrize("scale, expected", [("135M", 134_515_008), ("360M", 361_821_120), ("1.7B", 1_711_376_384)])
def test_published_parameter_counts_on_meta_device(scale, expected):
    model = build_model(ModelConfig(scale=scale), SCALES[scale], 49152, device="meta")
    assert model.num_params() == expected
    assert param_count(ModelConfig(scale=scale), SCALES[scale], 49152) == expected


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(scale="360M", variant="recursive", tying="middle_cycle", num_recursions=4),
        ModelConfig(scale="135M", variant="vanilla", reduced=True, num_recursions=3),
        ModelConfig(scale="135M", variant="mor", tying="cycle", num_recursions=3,
                    router=RouterConfig(arch="wide_mlp", aux="aux_router")),
    ],
)
def test_param_count_formula_matches_real_size_model(cfg):
    model = build_model(cfg, SCALES[cfg.scale], 49152, device="meta")
    assert model.num_params() == param_count(cfg, SCALES[cfg.scale], 49152)


def test_tied_layers_share_tensors():
    cfg = ModelConfig(scale="tiny", variant="recursive", tying="cycle", num_recursions=2)
    model = build_model(cfg, SCALES["tiny"], 64)
    rec0, rec1 = model.plan.recursions
    for a, b in zip(model.layers_at(rec0), model.layers_at(rec1)):
        assert a.self_attn.q_proj.weight is b.self_attn.q_proj.weight
        assert a.mlp.down_proj.weight is b.mlp.down_proj.weight
    vanilla = build_model(ModelConfig(scale="tiny"), SCALES["tiny"], 64)
    assert model.num_params() < vanilla.num_params()


VARIANTS = [
    ModelConfig(scale="tiny"),
    ModelConfig(scale="tiny", variant="vanilla", reduced=True, num_recursions=2),
    *[ModelConfig(scale="tiny", variant="recursive", tying=t, num_recursions=nr)
      for t in ("cycle", "sequence", "middle_cycle", "middle_sequence") for nr in (2, 3)],
]


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: f"{c.variant}-{c.tying}-{c.num_recursions}-{c.reduced}")
def test_causality(cfg):
    """Changing token t+1 never changes the logits at positions <= t."""
    torch.manual_seed(0)
    model = build_model(cfg, SCALES["tiny"], 50).eval()
    x = torch.randint(0, 50, (2, 12))
    t = 6
    y = x.clone()
    y[:, t + 1] = (y[:, t + 1] + 7) % 50
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


# floor is the authors' int(capacity * T), ceil never below the capacity (before issue 56)
@pytest.mark.parametrize("nr, seq, rounding, expected", [
    (3, 12, "floor", [12, 8, 4]), (2, 10, "floor", [10, 5]), (4, 8, "floor", [8, 6, 4, 2]), (3, 7, "floor", [7, 4, 2]),
    (3, 12, "ceil", [12, 8, 4]), (3, 7, "ceil", [7, 5, 3]),
])
def test_expert_choice_hierarchical_capacities(nr, seq, rounding, expected):
    cfg = ModelConfig(scale="tiny", variant="mor", tying="cycle", num_recursions=nr,
                      router=RouterConfig(capacity_rounding=rounding))
    model = build_model(cfg, SCALES["tiny"], 50)
    out = model(torch.randint(0, 50, (3, seq)), torch.randint(0, 50, (3, seq)))
    counts = [int(s.sum(1)[0]) for s in out.routing.selected]
    assert counts == expected
    for prev, cur in zip(out.routing.selected, out.routing.selected[1:]):
        assert not (cur & ~prev).any(), "a token dropped at recursion r came back later"
    depths = out.routing.depths()
    assert depths.min() >= 1 and depths.max() <= nr
    assert out.aux_loss.item() > 0  # the BCE that trains the causal decision is on


def test_explicit_capacity_must_match_recursions():
    from mor.config import ConfigError

    with pytest.raises(ConfigError, match="capacity has 2 entries"):
        ModelConfig(scale="tiny", variant="mor", num_recursions=3, router=RouterConfig(capacity=(1.0, 0.5)))


def _router_gradient_check(planted: float | None = None):
    from helpers.gradients import directional_check, float64_norms, lm_loss64, planted_gate_error

    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=2)
    torch.manual_seed(0)
    model = build_model(cfg, SCALES["tiny"], 50).double()
    x = torch.randint(0, 50, (2, 10))
    params = list(model.routers.parameters())
    plant = planted_gate_error(planted) if planted else contextlib.nullcontext()
    with float64_norms(), plant:
        check = directional_check(model, params, lambda: lm_loss64(model, x))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    return check


def test_router_gradient_matches_finite_differences():
    """The routers' gradient (through the gate weights) is the loss's derivative: autograd
    along a random direction equals the extrapolated central difference (float64) within the
    difference's own error, and that error is small enough to see a 1 % wrong gradient."""
    check = _router_gradient_check()
    assert abs(check.autograd) > 1e-9, "a zero directional derivative would compare nothing"
    assert check.resolution < 1e-3, f"the check cannot resolve a 1 % error: {check}"
    assert check.agrees, check


def test_router_gradient_check_catches_a_planted_one_percent_gate_error():
    """The same check fails when the gate's backward is 1 % wrong (the bug it exists for)."""
    check = _router_gradient_check(planted=1.01)
    assert check.resolution < 1e-3
    assert not check.agrees, check
    assert check.autograd / check.reference == pytest.approx(1.01, rel=1e-3)


def test_untied_attention_gives_each_later_recursion_its_own_qkvo():
    """model.recursion_attention 'untied' (the authors' release): recursions 2..Nr of each
    shared layer attend with their own q/k/v/o (MLP and norms tied); with those copied from
    the tied attention it is the tied model, and the engine and the exporter refuse it."""
    from mor.config import ConfigError
    from mor.export_hf import refusal
    from mor.model import decode

    kw = dict(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3)
    tied = build_model(ModelConfig(**kw), SCALES["tiny"], 50, init_seed=0)
    untied = build_model(ModelConfig(**kw, recursion_attention="untied"), SCALES["tiny"], 50, init_seed=0)
    per_attn = sum(p.numel() for p in tied.unique_layers[1].self_attn.parameters())
    assert sorted(untied.recursion_attn) == ["1_1", "1_2"]  # unique layer 1, recursions 2 and 3
    assert untied.num_params() == tied.num_params() + 2 * per_attn
    x = torch.randint(0, 50, (2, 12))
    out = untied(x, x)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in untied.recursion_attn.parameters())
    with torch.no_grad():
        for key, attn in untied.recursion_attn.items():
            attn.load_state_dict(untied.unique_layers[int(key.split("_")[0])].self_attn.state_dict())
        tied.load_state_dict({k: v for k, v in untied.state_dict().items() if not k.startswith("recursion_attn")})
        torch.testing.assert_close(untied.eval()(x).logits, tied.eval()(x).logits, rtol=0, atol=0)
        torch.testing.assert_close(decode.full_forward_causal(untied, x).logits,
                                   decode.full_forward_causal(tied, x).logits, rtol=0, atol=0)
    assert "recursion_attention" in refusal(untied.cfg)
    with pytest.raises(ConfigError, match="recursion_attention"):
        ModelConfig(**{**kw, "tying": "sequence"}, recursion_attention="untied")
    with pytest.raises(ConfigError, match="recursion_attention"):
        ModelConfig(scale="tiny", recursion_attention="untied")
