"""Router kinds behind one interface (mor.model.routers; docs/routers.md).

The built-in kinds and architectures answer the questions the rest of the suite used to ask
by string, and the allowed names are the registry's. Then a documented example kind,
``FullDepth`` (every token runs every recursion; the router only weighs the gate after the
stack), is defined here, registered, and built, trained one step, decoded and served by the
engine, with no other file changed: what docs/routers.md promises a new kind needs.
"""

from __future__ import annotations

import pytest
import torch

from helpers.engine import TINY, V, make, solo
from mor.config import ConfigError, ModelConfig, RouterConfig
from mor.engine import Engine, Request
from mor.flops import param_count, recursion_flops_per_token
from mor.model.decode import full_forward_causal, generate
from mor.model.kv_layout import design_fractions
from mor.model.routers import registry
from mor.model.routers.base import RouterKind
from mor.model.transformer import build_model


# ---------------------------------------------------------------------- the example kind
class FullDepth(RouterKind):
    """Example router kind: every token runs all Nr recursions (depth chosen up front, always
    Nr), and the token-choice router's score of depth Nr weighs the gate after the stack.

    It reuses token-choice's router module and packed stack (``run_token_choice`` asks the
    model's kind for the depths), so it only says what differs: its decision and its shares."""

    name = "full_depth_example"
    per_recursion = False  # depths before recursion 1, one gate after the stack

    def heads(self, num_recursions, rcfg):
        return 1, num_recursions

    def design_fractions(self, num_recursions, rcfg):
        return [1.0] * num_recursions  # every token reaches every recursion

    def kept_row_bytes(self, hidden):
        return hidden + 8

    def build_routers(self, hidden, num_recursions, rcfg):
        from mor.model.router import TokenChoiceRouter

        return [TokenChoiceRouter(hidden, num_recursions, rcfg)]

    def run(self, model, h, positions, trace, max_depth=None):
        from mor.model.token_choice import run_token_choice

        return run_token_choice(model, h, positions, trace, max_depth=max_depth)

    def token_depths(self, model, h, *, warmup=False, max_depth=None):
        from mor.model.routing import token_depths

        return token_depths(model, h, warmup=True, max_depth=max_depth)  # 'warm-up': depth Nr for all


@pytest.fixture
def full_depth():
    registry.register_kind(FullDepth())
    try:
        yield ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                          router=RouterConfig(type="full_depth_example", func="softmax", alpha=1.0))
    finally:
        registry.unregister("full_depth_example")


# ---------------------------------------------------------------------- the registry
def test_allowed_names_are_the_registry_s():
    assert registry.kind_names() == ("expert_choice", "token_choice")
    assert registry.arch_names() == ("linear", "mlp", "wide_mlp")
    with pytest.raises(ConfigError, match="full_depth_example|choose one of"):
        RouterConfig(type="full_depth_example")
    with pytest.raises(ConfigError, match="softmax"):  # a kind's own config check
        RouterConfig(type="expert_choice", func="softmax")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_kind(registry.router_kind("token_choice"))


@pytest.mark.parametrize("arch", ["linear", "mlp", "wide_mlp"])
@pytest.mark.parametrize("out", [1, 3])
def test_an_architecture_counts_the_parameters_its_head_holds(arch, out):
    a = registry.router_arch(arch)
    assert a.params(32, out) == sum(p.numel() for p in a.head(32, out).parameters())


def test_builtin_kinds_answer_the_shares_and_readbacks():
    ec, tc = registry.router_kind("expert_choice"), registry.router_kind("token_choice")
    rc = RouterConfig(capacity=(1.0, 0.5, 0.25))
    assert ec.design_fractions(3, rc) == [1.0, 0.5, 0.25] and ec.engine_drops(3, rc) == [False, True, True]
    assert tc.design_fractions(3, rc) == pytest.approx([1.0, 2 / 3, 1 / 3]) and tc.engine_drops(3, rc) == [False] * 3
    assert (ec.per_recursion, tc.per_recursion) == (True, False)
    assert registry.exported_kinds() == ("expert_choice", "token_choice")


# ---------------------------------------------------------------------- the example, end to end
def test_example_kind_builds_counts_and_trains_one_step(full_depth):
    cfg = full_depth
    assert design_fractions(cfg) == [1.0, 1.0, 1.0]
    assert RouterConfig(type="full_depth_example").type == "full_depth_example"  # now allowed
    torch.manual_seed(0)
    model = build_model(cfg, TINY, V)
    assert model.num_params() == param_count(cfg, TINY, V)
    # every recursion runs every token: the same FLOPs per recursion as recursion 1
    per_rec = recursion_flops_per_token(cfg, TINY, 16)
    assert per_rec[0] == pytest.approx(per_rec[1]) == pytest.approx(per_rec[2])
    model.train()
    idx = torch.randint(0, V, (2, 12))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.routers[0].head.weight.detach().clone()
    out = model(idx, targets=idx.roll(-1, 1))
    out.loss.backward()
    opt.step()
    assert torch.isfinite(out.loss)
    assert all(bool(sel.all()) for sel in out.routing.selected)  # every token, every recursion
    assert not torch.equal(before, model.routers[0].head.weight)  # the router learns through the gate


def test_example_kind_decodes_and_the_engine_serves_it(full_depth):
    model = make(full_depth, 0)
    idx = torch.randint(0, V, (1, 7))
    ref = full_forward_causal(model, idx).logits
    assert torch.allclose(model(idx).logits, ref, atol=1e-5)  # causal as trained: the same routing
    reqs = [Request(i, [(3 * i + j) % V for j in range(2 + i)], 5) for i in range(4)]
    res = Engine(model, batch=3, max_len=16).run(reqs)
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
    assert res.recursion_tokens()[0] == res.recursion_tokens()[-1]  # no token exits early
    assert generate(model, idx, 3).shape == (1, 10)
