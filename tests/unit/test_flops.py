import dataclasses

import pytest

from mor.config import ModelConfig, load_scales
from mor.flops import forward_flops_per_token, layer_params, tokens_for_budget, train_flops

S = load_scales()


def test_layer_params_135m_by_hand():
    # q,o: 576*576 each; k,v: 576*192 each; SwiGLU 3*576*1536; two RMSNorm gains
    assert layer_params(S["135M"]) == 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576


def test_vanilla_flops_follow_6n_plus_attention():
    cfg, s, T = ModelConfig(scale="135M"), S["135M"], 2048
    n_mm = 30 * (layer_params(s) - 2 * 576)
    expected = 2 * n_mm + 30 * 4 * 576 * T + 2 * 576 * 49152
    assert forward_flops_per_token(cfg, s, 49152, T) == expected
    assert train_flops(cfg, s, 49152, T, 1000) == 3 * expected * 1000


def test_recursion_costs_like_its_effective_depth_and_mor_less():
    s, T = S["135M"], 2048
    van = forward_flops_per_token(ModelConfig(scale="135M"), s, 49152, T)
    rec = forward_flops_per_token(ModelConfig(scale="135M", variant="recursive", tying="cycle", num_recursions=3), s, 49152, T)
    mor = forward_flops_per_token(ModelConfig(scale="135M", variant="mor", tying="cycle", num_recursions=3), s, 49152, T)
    assert rec == pytest.approx(van)  # same 30 effective layers, fewer parameters
    assert mor < rec
    # capacities 1, 2/3, 1/3: matmuls scale by their mean (2/3), attention by the mean square (14/27)
    mm = 30 * 2 * (layer_params(s) - 2 * 576)
    attn = 30 * 4 * 576 * T
    router = 2 * 3 * 576
    assert mor == pytest.approx(2 * 576 * 49152 + mm * 2 / 3 + attn * 14 / 27 + router)


def test_tokens_for_budget_inverts_train_flops():
    cfg, s = ModelConfig(scale="360M"), S["360M"]
    tokens = tokens_for_budget(cfg, s, 49152, 2048, 2e18)
    assert train_flops(cfg, s, 49152, 2048, tokens) == pytest.approx(2e18, rel=1e-6)


@pytest.mark.parametrize("tying", ["cycle", "sequence", "middle_cycle"])
def test_vanilla_kv_sharing_saves_exactly_the_skipped_kv_projections(tying):
    """The formula's saving equals what torch counts for the real model's forward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mor.model.transformer import build_model

    shape, vocab, T = load_scales()["small"], 64, 32
    flops, counted = {}, {}
    for kv, group in (("recursion_wise", 1), ("shared", 2)):  # num_recursions = KV-sharing group size
        cfg = ModelConfig(scale="small", variant="vanilla", tying=tying, num_recursions=group, kv=kv)
        flops[kv] = forward_flops_per_token(cfg, shape, vocab, T)
        model = build_model(cfg, shape, vocab)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, T, dtype=torch.long))
        counted[kv] = counter.get_total_flops() / T  # per token; CPU SDPA is not counted (same in both)
    saved = counted["recursion_wise"] - counted["shared"]
    assert saved > 0
    assert flops["recursion_wise"] - flops["shared"] == pytest.approx(saved)


@pytest.mark.parametrize(("relaxation", "rank"), [("lora", 2), ("prefix", 4)])
@pytest.mark.parametrize("kv", ["recursion_wise", "shared"])
def test_relaxation_flops_match_what_torch_counts(relaxation, rank, kv):
    """LoRA's low-rank matmuls (none on k/v where a layer reads shared KV) and the prefix
    keys' attention, as FlopCounterMode counts them on the real model's forward."""
    import torch

    from mor.flop_count import measured_flops
    from mor.model.transformer import build_model

    shape, vocab, T = load_scales()["small"], 64, 32
    flops, counted = {}, {}
    for relax, r in (("none", 0), (relaxation, rank)):
        cfg = ModelConfig(scale="small", variant="recursive", tying="middle_cycle", num_recursions=3, kv=kv,
                          relaxation=relax, relaxation_rank=r)
        flops[relax] = forward_flops_per_token(cfg, shape, vocab, T)
        model = build_model(cfg, shape, vocab)
        with torch.no_grad():
            counted[relax] = measured_flops(lambda: model(torch.zeros(1, T, dtype=torch.long))) / T
    added = counted[relaxation] - counted["none"]
    assert added > 0
    assert flops[relaxation] - flops["none"] == pytest.approx(added)


def test_counts_use_the_model_s_own_plan_computed_once():
    """FLOPs and KV sizing ask for the tying plan the built model holds (``model.plan``), and
    planning a grid does not rebuild it for every count (one plan per config and depth)."""
    import dataclasses

    from mor.config import RouterConfig
    from mor.flops import plan_for
    from mor.model.transformer import build_model

    scales = load_scales()
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                      router=RouterConfig(type="token_choice"))
    s = scales["tiny"]
    plan = plan_for(cfg, s)
    assert plan == build_model(cfg, s, 50, device="meta").plan
    assert plan_for(dataclasses.replace(cfg), dataclasses.replace(s)) is plan  # an equal config: the same plan
    deeper = plan_for(cfg, dataclasses.replace(s, layers=s.layers + 6))  # +3 floors to the same depth (issue 55)
    assert len(deeper.order) > len(plan.order)  # the depth is part of the key


@pytest.mark.parametrize("variant,kv,router,capacity,shares", [
    ("mor", "shared", "expert_choice", (), (1.0, 2 / 3, 1 / 3)),
    ("mor", "recursion_wise", "expert_choice", (1.0, 0.5, 0.25), (1.0, 0.5, 0.25)),
    ("mor", "shared_dagger", "token_choice", (1.0, 0.5, 0.25), (1.0, 2 / 3, 1 / 3)),  # balanced, not the capacity
    ("recursive", "shared", "expert_choice", (), (1.0, 1.0, 1.0)),
    ("vanilla", "shared", "expert_choice", (), (1.0,))])
def test_counting_is_what_the_built_model_holds(variant, kv, router, capacity, shares):
    """Every count (FLOPs, parameters, memory, KV sizing) reads one ``Counting`` per config and
    depth; it must be the built model's own plan, KV producers and never-run K/V projections
    (read off the model: ``model.unused_parameter_names``), and the design shares written out
    here by hand: expert-choice keeps its capacities (hierarchical by default), token-choice
    the balanced assignment whatever capacity the config carries, no router every token."""
    from mor.config import RouterConfig
    from mor.flops import counting
    from mor.model.transformer import build_model

    # 6 layers: Sequence Nr 3 gives 2 unique layers (tiny's 4 floor to 1, issue 55, and a lone
    # unique layer reads no other layer's KV)
    s = dataclasses.replace(load_scales()["tiny"], layers=6)
    cfg = ModelConfig(scale="tiny", variant=variant, kv=kv, tying="sequence", layers=6, num_recursions=3 if variant != "vanilla" else 2,
                      router=RouterConfig(type=router, capacity=capacity))
    model = build_model(cfg, s, 50, device="meta")
    c = counting(cfg, s.layers)
    assert c.plan == model.plan and c.producers == tuple(model.kv_producers)
    unused = {int(n.split(".")[1]) for n in model.unused_parameter_names() if n.startswith("unique_layers.")}
    assert c.unused_layers == unused and (kv == "shared") == bool(unused)
    assert c.shares == pytest.approx(shares)
