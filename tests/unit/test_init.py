"""Common random numbers (mor.model.init): the variants of one seed start from the same
weights wherever canonical names and shapes agree; seeds differ; the old global-stream
draws stay available under model.weight_init: global_rng, with the old run ids."""

from __future__ import annotations

import dataclasses

import torch

from mor.config import ModelConfig, RouterConfig, RunConfig, TrainConfig, load_scales
from mor.model.init import canonical_names
from mor.model.transformer import build_model

SCALES = load_scales()
VOCAB = 64


def _build(seed: int = 0, layers: int = 5, **model) -> torch.nn.Module:
    cfg = ModelConfig(scale="tiny", **model)
    # Middle-Cycle Nr=3: 5 layers = 1 + 3 + 1; Cycle / Sequence Nr=3 need 6 for 2 unique layers
    # (the floor depth rule of issue 55 takes 5 to 3; the padding rule before took it to 6)
    shape = dataclasses.replace(SCALES["tiny"], layers=layers)
    return build_model(cfg, shape, VOCAB, init_seed=seed)


def _by_canonical(model) -> dict[str, torch.Tensor]:
    names = canonical_names(model, model.plan.order)
    return {names[n]: p for n, p in model.named_parameters()}


def test_canonical_names_follow_the_vanilla_layer_each_replaces():
    van = _build(variant="vanilla")
    mc = _build(variant="recursive", tying="middle_cycle", num_recursions=3)
    cyc = _build(variant="recursive", tying="cycle", num_recursions=3, layers=6)
    seq = _build(variant="recursive", tying="sequence", num_recursions=3, layers=6)
    layers = lambda m: sorted({k.split(".")[0] for k in _by_canonical(m) if k.startswith(("layer", "last"))})  # noqa: E731
    assert layers(van) == ["last", "layer0", "layer1", "layer2", "layer3"]
    assert mc.plan.order == [0, 1, 1, 1, 2] and layers(mc) == ["last", "layer0", "layer1"]
    assert cyc.plan.order == [0, 1, 0, 1, 0, 1] and layers(cyc) == ["layer0", "layer1"]
    assert seq.plan.order == [0, 0, 0, 1, 1, 1] and layers(seq) == ["layer0", "layer3"]


def test_vanilla_and_recursive_share_embedding_first_last_and_replaced_layers():
    van, rec = _by_canonical(_build(variant="vanilla")), _by_canonical(_build(variant="recursive", tying="middle_cycle",
                                                                              num_recursions=3))
    shared = [k for k in rec if k in van and van[k].dim() >= 2]
    assert {"embed", "layer0.self_attn.q_proj.weight", "layer1.mlp.up_proj.weight", "last.mlp.down_proj.weight"} <= set(shared)
    for k in shared:
        assert torch.equal(van[k], rec[k]), k


def test_mor_differs_from_its_recursive_twin_only_by_its_routers():
    rec = dict(_build(variant="recursive", tying="middle_cycle", num_recursions=3).named_parameters())
    mor = dict(_build(variant="mor", tying="middle_cycle", num_recursions=3,
                      router=RouterConfig(type="expert_choice")).named_parameters())
    assert set(mor) - set(rec) and all(k.startswith("routers.") for k in set(mor) - set(rec))
    for k, p in rec.items():
        assert torch.equal(p, mor[k]), k


def test_seeds_differ_and_repeat():
    a, b, a2 = (dict(_build(seed=s).named_parameters()) for s in (0, 1, 0))
    assert not torch.equal(a["embed_tokens.weight"], b["embed_tokens.weight"])
    assert all(torch.equal(a[k], a2[k]) for k in a)


def test_global_rng_keeps_the_old_draws_and_ids():
    torch.manual_seed(3)
    old = build_model(ModelConfig(scale="tiny", weight_init="global_rng"), SCALES["tiny"], VOCAB)
    torch.manual_seed(3)
    crn = build_model(ModelConfig(scale="tiny"), SCALES["tiny"], VOCAB)  # seed from torch.initial_seed()
    assert not torch.equal(old.embed_tokens.weight, crn.embed_tokens.weight)
    assert torch.equal(crn.embed_tokens.weight, build_model(ModelConfig(scale="tiny"), SCALES["tiny"], VOCAB,
                                                            init_seed=3).embed_tokens.weight)
    run = lambda **m: RunConfig(grid="g", model=ModelConfig(scale="tiny", **m), train=TrainConfig(seed=0))  # noqa: E731
    assert "weight_init" not in run(weight_init="global_rng").training_dict()["model"]  # the id runs had before
    assert run().run_id != run(weight_init="global_rng").run_id


def test_meta_models_build():
    m = build_model(ModelConfig(scale="tiny"), SCALES["tiny"], VOCAB, device="meta")
    assert m.num_params() > 0


def test_residual_init_and_the_previous_settings_keep_their_ids():
    """model.residual_init 'normal' (the authors', HF's N(0, 0.02) for every matrix) draws the
    residual output projections at the std of the others; 'scaled' (ours before issue 56) at
    std / sqrt(2 L). The settings of issue 56 at their previous values leave the hash."""
    normal = build_model(ModelConfig(scale="tiny"), SCALES["tiny"], VOCAB, init_seed=0)
    scaled = build_model(ModelConfig(scale="tiny", residual_init="scaled"), SCALES["tiny"], VOCAB, init_seed=0)
    depth = len(normal.plan.order)
    o_n, o_s = normal.unique_layers[0].self_attn.o_proj.weight, scaled.unique_layers[0].self_attn.o_proj.weight
    torch.testing.assert_close(o_s, o_n / (2 * depth) ** 0.5)  # the same z, another std
    assert torch.equal(normal.unique_layers[0].self_attn.q_proj.weight, scaled.unique_layers[0].self_attn.q_proj.weight)
    router = RouterConfig(combine="layer_update", capacity_rounding="ceil", aux_accum_steps=1)
    old = RunConfig(grid="g", model=ModelConfig(scale="tiny", variant="mor", num_recursions=3, router=router,
                                                 residual_init="scaled"))
    new = RunConfig(grid="g", model=ModelConfig(scale="tiny", variant="mor", num_recursions=3))
    hashed = old.training_dict()["model"]
    assert "residual_init" not in hashed and "recursion_attention" not in hashed
    assert not {"combine", "capacity_rounding", "aux_accum_steps"} & set(hashed["router"])
    assert {"combine", "capacity_rounding", "aux_accum_steps"} <= set(new.training_dict()["model"]["router"])
    assert old.run_id != new.run_id
