"""Relaxed weight tying (mor.model.relax): identity at init, training, exact parameter counts."""

import copy

import pytest
import torch

from mor.config import ConfigError, ModelConfig, load_scales
from mor.flops import param_count, relaxation_params
from mor.model.relax import LORA_TARGETS, LowRankDelta, relaxed_slots
from mor.model.transformer import build_model
from mor.model.tying import tying_plan

S = load_scales()
TINY = S["tiny"]  # C=32, 4 layers, 4 heads, 2 KV heads (kv width 16), MLP 64
V = 50
RELAX = [("lora", 2), ("dora", 2), ("prefix", 3), ("recursion_pe", 0)]


def cfg_of(relaxation, rank, variant="recursive", tying="middle_cycle", nr=2, **kw):
    return ModelConfig(scale="tiny", variant=variant, tying=tying, num_recursions=nr,
                       relaxation=relaxation, relaxation_rank=rank, **kw)


def relaxed_and_plain(cfg, seed=0):
    """A relaxed model and the unrelaxed model holding the same tied weights."""
    torch.manual_seed(seed)
    relaxed = build_model(cfg, TINY, V)
    plain = build_model(ModelConfig(**{**cfg.__dict__, "relaxation": "none", "relaxation_rank": 0}), TINY, V)
    missing, unexpected = plain.load_state_dict(relaxed.state_dict(), strict=False)
    assert not missing and all(k.startswith("relax.") for k in unexpected)
    return relaxed.eval(), plain.eval()


def test_relaxed_slots_by_hand():
    # Sequence over 6 layers, Nr=2: chunks (0,0,1) and (1,2,2): layer 1 runs in both recursions
    assert relaxed_slots(tying_plan("sequence", 6, 2)) == [(0, 0), (1, 0), (1, 1), (2, 1)]
    # Middle-Cycle 1 + 2x3 + 1: the unshared layers 0 and 3 get no slot
    assert relaxed_slots(tying_plan("middle_cycle", 8, 3)) == [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("relaxation, rank", [r for r in RELAX if r[0] != "prefix"])
@pytest.mark.parametrize("variant", ["recursive", "mor"])
def test_starts_equal_to_the_tied_model(relaxation, rank, variant):
    relaxed, plain = relaxed_and_plain(cfg_of(relaxation, rank, variant=variant, tying="cycle"))
    x = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(relaxed(x).logits, plain(x).logits, rtol=0, atol=1e-6)


def test_prefix_is_not_an_identity_at_init():
    """Prefix keys take softmax mass from the real tokens from the first step (documented)."""
    relaxed, plain = relaxed_and_plain(cfg_of("prefix", 3))
    x = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        assert (relaxed(x).logits - plain(x).logits).abs().max() > 1e-6


@pytest.mark.parametrize("relaxation, rank", RELAX)
@pytest.mark.parametrize("variant, tying", [("recursive", "middle_cycle"), ("recursive", "sequence"), ("mor", "cycle")])
def test_trains_and_keeps_weights_tied(relaxation, rank, variant, tying):
    torch.manual_seed(0)
    model = build_model(cfg_of(relaxation, rank, variant=variant, tying=tying), TINY, V)
    ids_before = {n: id(p) for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, V, (4, 16))
    losses = []
    for _ in range(3):
        out = model(x, x)
        out.loss.backward()
        losses.append(out.loss.item())
        relax_grads = {n: p.grad for n, p in model.relax.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    # after two optimizer steps B != 0, so LoRA's A and B both see gradient; so does everything else
    dead = [n for n, g in relax_grads.items() if g is None or g.abs().sum() == 0]
    assert not dead, f"no gradient reaches {dead[:4]}"
    assert {n: id(p) for n, p in model.named_parameters()} == ids_before  # no tensor replaced
    # the tied weights are those of the unrelaxed model: same names, nothing copied per recursion
    plain = build_model(cfg_of("none", 0, variant=variant, tying=tying), TINY, V)
    assert {n for n in ids_before if not n.startswith("relax.")} == {n for n, _ in plain.named_parameters()}
    shared = [u for rec in model.plan.recursions for u in rec]
    assert len(model.unique_layers) == model.plan.num_unique < len(shared) + len(model.plan.prefix) * 2


@pytest.mark.parametrize("relaxation, rank", RELAX)
@pytest.mark.parametrize("tying", ["cycle", "sequence", "middle_cycle", "middle_sequence"])
@pytest.mark.parametrize("nr", [2, 3])
def test_param_count_formula_is_exact(relaxation, rank, tying, nr):
    cfg = cfg_of(relaxation, rank, tying=tying, nr=nr)
    model = build_model(cfg, TINY, V)
    plain = build_model(cfg_of("none", 0, tying=tying, nr=nr), TINY, V)
    assert model.num_params() == param_count(cfg, TINY, V)
    assert model.num_params() - plain.num_params() == relaxation_params(cfg, TINY) > 0
    assert sum(p.numel() for p in model.relax.parameters()) == relaxation_params(cfg, TINY)


def test_extra_params_by_hand():
    # tiny Middle-Cycle Nr=2: 1 + 1x2 + 1 -> slots (1,0), (1,1). Per slot, rank r:
    # q, o: r(32+32); k, v: r(32+16); gate, up, down: r(32+64)  ->  r * 512
    assert relaxation_params(cfg_of("lora", 2), TINY) == 2 * 2 * 512
    # DoRA adds one magnitude per output row: q, o, down 32 each; k, v 16; gate, up 64 -> 256
    assert relaxation_params(cfg_of("dora", 2), TINY) == 2 * (2 * 512 + 256)
    # prefix: P keys + P values of 2 KV heads x head dim 8
    assert relaxation_params(cfg_of("prefix", 3), TINY) == 2 * 2 * 3 * 16
    assert relaxation_params(cfg_of("recursion_pe", 0), TINY) == 2 * 32


def test_real_scale_360m_lora_rank8_on_meta():
    cfg = ModelConfig(scale="360M", variant="recursive", tying="middle_cycle", num_recursions=3,
                      relaxation="lora", relaxation_rank=8)
    s = S["360M"]
    model = build_model(cfg, s, 49152, device="meta")
    # 32 layers -> 1 + 10x3 + 1: 30 slots; per slot 8 * (9*960 + 2*320 + 3*2560) = 8 * 16960
    extra = 30 * 8 * 16960
    assert relaxation_params(cfg, s) == extra == 4_070_400
    assert model.num_params() == param_count(cfg, s, 49152)
    base = param_count(ModelConfig(scale="360M", variant="recursive", tying="middle_cycle", num_recursions=3), s, 49152)
    assert model.num_params() == base + extra
    delta = model.relax.slots["layer1_rec2"]["k_proj"]
    assert delta.A.shape == (8, 960) and delta.B.shape == (320, 8)
    assert set(model.relax.slots["layer1_rec0"]) == set(LORA_TARGETS)


@pytest.mark.parametrize("relaxation, rank", [("dora", 4), ("prefix", 16), ("recursion_pe", 0)])
def test_real_scale_135m_meta_construction(relaxation, rank):
    cfg = ModelConfig(scale="135M", variant="mor", tying="middle_cycle", num_recursions=3,
                      relaxation=relaxation, relaxation_rank=rank)
    model = build_model(cfg, S["135M"], 49152, device="meta")
    assert model.num_params() == param_count(cfg, S["135M"], 49152)


def test_dora_row_norm_formula_matches_the_merged_matrix():
    torch.manual_seed(0)
    W = torch.randn(12, 20)
    d = LowRankDelta(20, 12, 3, dora=True, weight=W)
    with torch.no_grad():
        d.B.normal_()
    merged = W + d.scale * d.B @ d.A
    torch.testing.assert_close(d.row_norm(W), merged.norm(dim=1), rtol=1e-5, atol=1e-5)
    x = torch.randn(5, 20)
    expected = (d.magnitude / merged.norm(dim=1)) * (x @ merged.T)
    torch.testing.assert_close(d(x, x @ W.T, W), expected, rtol=1e-5, atol=1e-5)


def test_lora_delta_is_per_recursion():
    """A nonzero B at recursion 1 changes the output; the same B at recursion 0 is independent."""
    relaxed, plain = relaxed_and_plain(cfg_of("lora", 2, tying="cycle"))
    x = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        relaxed.relax.slots["layer0_rec1"]["v_proj"].B.fill_(0.1)
        a = relaxed(x).logits
        assert (a - plain(x).logits).abs().max() > 1e-4
        # the shared linear called outside run_layer keeps its tied output
        h = torch.randn(2, 10, 32)
        lin = relaxed.unique_layers[0].self_attn.v_proj
        torch.testing.assert_close(lin(h), h @ lin.weight.T)


def test_layer_kv_sees_the_recursions_kv_delta():
    """KV sharing / caches take a layer's K/V via model.layer_kv: LoRA on k_proj applies there."""
    relaxed, plain = relaxed_and_plain(cfg_of("lora", 2, tying="cycle"))
    h, pos = torch.randn(2, 6, 32), torch.arange(6).expand(2, 6)
    with torch.no_grad():
        relaxed.relax.slots["layer1_rec1"]["k_proj"].B.fill_(0.3)
        k0, _ = relaxed.layer_kv(1, h, pos, recursion=0)
        k1, v1 = relaxed.layer_kv(1, h, pos, recursion=1)
        pk, pv = plain.layer_kv(1, h, pos, recursion=1)
    torch.testing.assert_close(k0, pk)
    torch.testing.assert_close(v1, pv)
    assert (k1 - pk).abs().max() > 1e-3


def test_deepcopy_rebinds_hooks_to_the_copy():
    relaxed, _ = relaxed_and_plain(cfg_of("lora", 2, tying="cycle"))
    twin = copy.deepcopy(relaxed)
    x = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        before = relaxed(x).logits
        twin.relax.slots["layer1_rec0"]["q_proj"].B.fill_(0.2)
        torch.testing.assert_close(relaxed(x).logits, before)  # the original ignores the copy's deltas
        assert (twin(x).logits - before).abs().max() > 1e-4


def test_prefix_is_visible_to_every_query_and_keeps_causality():
    torch.manual_seed(0)
    model = build_model(cfg_of("prefix", 2, tying="cycle"), TINY, V).eval()
    x = torch.randint(0, V, (2, 12))
    y = x.clone()
    y[:, 7] = (y[:, 7] + 5) % V
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
        torch.testing.assert_close(a[:, :7], b[:, :7])  # still causal
        assert not torch.allclose(a[:, 7:], b[:, 7:])
        model.relax.slots["layer0_rec0"][1].fill_(3.0)  # values: position 0 sees them too
        c = model(x).logits
    assert (c[:, 0] - a[:, 0]).abs().max() > 1e-3


def test_prefix_extends_an_explicit_mask_and_given_kv():
    """KV strategies pass kv/attn_mask through run_layer; the prefix is prepended to both."""
    torch.manual_seed(0)
    model = build_model(cfg_of("prefix", 2, tying="cycle"), TINY, V).eval()
    layer = model.unique_layers[0]
    h, pos = torch.randn(2, 6, 32), torch.arange(6).expand(2, 6)
    kv = layer.self_attn.project_kv(layer.input_layernorm(h), pos, model.rope)
    causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6)
    with torch.no_grad():
        implicit = model.run_layer(0, h, pos, recursion=0)
        explicit = model.run_layer(0, h, pos, recursion=0, kv=kv, attn_mask=causal)
    torch.testing.assert_close(implicit, explicit)
    with pytest.raises(ValueError, match="explicit attn_mask"):
        model.run_layer(0, h[:, :3], pos[:, :3], recursion=0, kv=kv)


def test_recursion_pe_scales_each_recursion_output():
    relaxed, plain = relaxed_and_plain(cfg_of("recursion_pe", 0, tying="cycle"))  # no suffix layer
    assert len(relaxed.relax.gains) == 2 and all(g.dim() == 1 for g in relaxed.relax.gains)
    seen = {}
    for name, m in (("relaxed", relaxed), ("plain", plain)):
        m.norm.register_forward_hook(lambda mod, inp, out, name=name: seen.__setitem__(name, inp[0]))
    x = torch.randint(0, V, (2, 10))
    gain = torch.linspace(0.5, 2.0, 32)
    with torch.no_grad():
        relaxed.relax.gains[1].copy_(gain)
        relaxed(x), plain(x)
        # the last recursion's output, which the final norm reads, is scaled channel-wise
        torch.testing.assert_close(seen["relaxed"], seen["plain"] * gain, rtol=1e-5, atol=1e-6)
        relaxed.relax.gains[0].copy_(gain)  # recursion 0's output feeds recursion 1: not a plain rescale
        relaxed(x)
        assert (seen["relaxed"] - seen["plain"] * gain).abs().max() > 1e-4


@pytest.mark.parametrize("variant, router", [("recursive", None), ("mor", "expert_choice"), ("mor", "token_choice")])
def test_every_recursion_loop_calls_end_recursion(variant, router):
    """Each routing path must hand every recursion's output to the PE hook (gains get gradient)."""
    from mor.config import RouterConfig

    kw = {} if router is None else {"router": RouterConfig(type=router, func="softmax" if router == "token_choice" else "sigmoid")}
    torch.manual_seed(0)
    model = build_model(cfg_of("recursion_pe", 0, variant=variant, tying="cycle", nr=3, **kw), TINY, V)
    x = torch.randint(0, V, (4, 16))
    model(x, x).loss.backward()
    assert all(g.grad is not None and g.grad.abs().sum() > 0 for g in model.relax.gains)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(relaxation="lora"), "relaxation_rank > 0"),
        (dict(relaxation="prefix"), "prefix length"),
        (dict(relaxation="recursion_pe", relaxation_rank=4), "no effect"),
        (dict(relaxation="none", relaxation_rank=4), "no effect"),
        (dict(relaxation="lora", relaxation_rank=-1), "relaxation_rank"),
        (dict(variant="vanilla", num_recursions=1, relaxation="lora", relaxation_rank=4), "needs variant recursive/mor"),
    ],
)
def test_config_validation(kw, match):
    base = dict(scale="tiny", variant="recursive", num_recursions=2)
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**{**base, **kw})
