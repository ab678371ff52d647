"""KV strategies: who produces each layer's KV, training-time sharing, the static cache,
its misuse errors, and the KV memory formulas of PAPER.md's cost table."""

import dataclasses

import pytest
import torch

from mor.config import ConfigError, ModelConfig, RouterConfig, load_scales
from mor.flops import (
    attention_flops_fraction,
    kv_cache_bytes,
    kv_io_fraction,
    kv_memory_fraction,
    relative_max_batch,
)
from mor.model.decode import decode_step, full_forward_causal, full_forward_routed, init_cache, prefill
from mor.model.kv_cache import EMPTY, KVSlot
from mor.model.transformer import build_model
from mor.model.tying import kv_producers, tying_plan, vanilla_plan

S = load_scales()
TINY = S["tiny"]
V = 50


def tiny(variant="mor", tying="cycle", nr=3, kv="recursion_wise", **router):
    return ModelConfig(scale="tiny", variant=variant, tying=tying, num_recursions=nr, kv=kv,
                       router=RouterConfig(**router))


# ------------------------------------------------------------------ memory formulas
@pytest.mark.parametrize("nr, batch, seed_batch", [(2, 42.667, 42), (3, 48.0, 48), (4, 51.2, 51)])
def test_relative_max_batch_matches_app_e(nr, batch, seed_batch):
    assert kv_memory_fraction("recursion_wise", nr) == pytest.approx((nr + 1) / (2 * nr))
    assert relative_max_batch(nr) == pytest.approx(batch, abs=1e-3)
    assert int(relative_max_batch(nr)) == seed_batch
    assert kv_memory_fraction("shared", nr) == pytest.approx(1 / nr)
    assert relative_max_batch(nr, strategy="shared") == pytest.approx(32 * nr)


def test_kv_io_and_attention_fractions_follow_the_cost_table():
    assert kv_io_fraction("recursion_wise", 3) == pytest.approx(4 / 6)
    assert kv_io_fraction("shared", 3) == 1.0
    assert attention_flops_fraction("recursion_wise", 0.25) == pytest.approx(0.0625)
    assert attention_flops_fraction("shared", 0.25) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="recursion_wise"):
        kv_memory_fraction("shared_dagger", 3)


@pytest.mark.parametrize("nr", [2, 3, 4])
def test_kv_cache_bytes_at_135m_give_the_paper_ratios(nr):
    """Cycle MoR (no unshared layers) vs a vanilla stack of the same effective depth."""
    s = S["135M"]
    mor = ModelConfig(scale="135M", variant="mor", tying="cycle", num_recursions=nr)
    depth = 30 if 30 % nr == 0 else 28  # effective_depth('cycle', 30, 4) = 28 (floor, issue 55; 32 padded before)
    vanilla = kv_cache_bytes(ModelConfig(scale="135M"), dataclasses.replace(s, layers=depth), 8, 2048 * 3)
    ratio = kv_cache_bytes(mor, s, 8, 2048 * 3) / vanilla
    assert ratio == pytest.approx((nr + 1) / (2 * nr))
    shared = kv_cache_bytes(dataclasses.replace(mor, kv="shared"), s, 8, 2048 * 3) / vanilla
    assert shared == pytest.approx(1 / nr)
    dagger = kv_cache_bytes(dataclasses.replace(mor, kv="shared_dagger"), s, 8, 2048 * 3) / vanilla
    assert dagger == pytest.approx(1.0)  # a dagger slot mirrors recursion 1's full slot
    # 'full' sizing allocates max_len for every slot: no saving from recursion-wise caching
    assert kv_cache_bytes(mor, s, 8, 2048 * 3, sizing="full") == pytest.approx(vanilla)
    # by hand: 30 layers x 2 (K,V) x 3 kv heads x 64 dims x 2 bytes x 8 x 6144 tokens
    if depth == 30:
        assert vanilla == 30 * 2 * 3 * 64 * 2 * 8 * 6144


@pytest.mark.parametrize("kv", ["recursion_wise", "shared", "shared_dagger"])
@pytest.mark.parametrize("sizing", ["full", "capacity"])
def test_allocated_cache_matches_the_byte_formula(kv, sizing):
    cfg = tiny(tying="middle_cycle", kv=kv)
    model = build_model(cfg, TINY, V)
    cache = init_cache(model, batch=3, max_len=24, sizing=sizing)
    assert cache.nbytes() == kv_cache_bytes(cfg, TINY, 3, 24, bytes_per_elem=4, sizing=sizing)


def test_real_size_cache_layout_on_meta_device():
    # the paper's MoR-4 at 360M: model.layers 34 (App. E); 32 layers floor to 30 (issue 55)
    cfg = ModelConfig(scale="360M", variant="mor", tying="middle_cycle", num_recursions=4, kv="shared", layers=34)
    s34 = dataclasses.replace(S["360M"], layers=34)
    model = build_model(cfg, s34, 49152, device="meta")
    assert len(model.kv_producers) == 34  # 1 + 8 x 4 + 1
    cache = init_cache(model, batch=2, max_len=2048, device="meta")
    assert cache.nbytes() == kv_cache_bytes(cfg, s34, 2, 2048, bytes_per_elem=4)
    assert len(cache.slots) == 1 + 8 + 1  # prefix, recursion 1, suffix


# ------------------------------------------------------------------ who produces the KV
def test_kv_producers_for_tied_and_vanilla_patterns():
    plan = tying_plan("middle_cycle", 8, 3)  # 0 | (1,2) x 3 | 3
    assert kv_producers(plan, "recursion_wise", "mor", "middle_cycle", 3) == tuple(range(8))
    assert kv_producers(plan, "shared", "mor", "middle_cycle", 3) == (0, 1, 2, 1, 2, 1, 2, 7)
    seq = tying_plan("sequence", 4, 2)  # recursions (0,0), (1,1): position rule, not unique layer
    assert kv_producers(seq, "shared", "recursive", "sequence", 2) == (0, 1, 0, 1)
    v6 = vanilla_plan(6)
    assert kv_producers(v6, "shared", "vanilla", "cycle", 1) == (0, 1, 2, 0, 1, 2)  # pairs, Cycle
    assert kv_producers(v6, "shared", "vanilla", "sequence", 1) == (0, 0, 2, 2, 4, 4)  # pairs, Sequence
    assert kv_producers(v6, "shared", "vanilla", "sequence", 3) == (0, 0, 0, 3, 3, 3)
    assert kv_producers(v6, "shared", "vanilla", "middle_cycle", 2) == (0, 1, 2, 1, 2, 5)


def test_kv_config_validation():
    with pytest.raises(ConfigError, match="shared_dagger"):
        ModelConfig(scale="tiny", variant="recursive", num_recursions=2, kv="shared_dagger")
    with pytest.raises(ConfigError, match="num_recursions > 1"):
        ModelConfig(scale="tiny", num_recursions=3)
    with pytest.raises(ConfigError, match="reduced"):
        ModelConfig(scale="tiny", num_recursions=2, reduced=True, kv="shared")
    assert ModelConfig(scale="tiny", num_recursions=3, kv="shared", tying="sequence").num_recursions == 3


# ------------------------------------------------------------------ training-time KV sharing
def _count_kv_tokens(model):
    """Record, per k_proj call, how many tokens it projected."""
    calls = []
    for layer in model.unique_layers:
        layer.self_attn.k_proj.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[1]))
    return calls


def test_recursive_sharing_skips_kv_projection_and_changes_the_output():
    torch.manual_seed(0)
    x = torch.randint(0, V, (2, 12))
    outs = {}
    for kv in ("recursion_wise", "shared"):
        torch.manual_seed(1)
        model = build_model(tiny(variant="recursive", nr=2, kv=kv), TINY, V)
        calls = _count_kv_tokens(model)
        outs[kv] = model(x).logits
        # cycle Nr=2, 4 layers: recursions (0,1),(0,1); sharing projects KV in recursion 1 only
        assert calls == ([12] * 4 if kv == "recursion_wise" else [12] * 2)
        torch.testing.assert_close(outs[kv], full_forward_causal(model, x).logits)
    assert not torch.allclose(outs["shared"], outs["recursion_wise"])


@pytest.mark.parametrize("kv", ["shared", "shared_dagger"])
def test_mor_sharing_computes_only_active_tokens(kv):
    """Recursion r > 1 projects no KV (shared) or only its k active tokens' KV (dagger)."""
    torch.manual_seed(0)
    # cycle Nr=3 on 6 layers: 6 effective layers, capacities 12/8/4 (tiny's 4 floor to 3, issue 55)
    model = build_model(tiny(kv=kv), dataclasses.replace(TINY, layers=6), V)
    calls = _count_kv_tokens(model)
    model(torch.randint(0, V, (2, 12)))
    assert calls == ([12, 12] if kv == "shared" else [12, 12, 8, 8, 4, 4])


@pytest.mark.parametrize("tying", ["cycle", "middle_cycle", "sequence"])
@pytest.mark.parametrize("kv", ["recursion_wise", "shared", "shared_dagger"])
def test_training_kv_strategies_match_the_masked_reference(tying, kv):
    """The gathered top-k training path equals a dense pass that computes every token and
    masks keys to the tokens each layer's KV holds, under the same top-k selections."""
    torch.manual_seed(0)
    model = build_model(tiny(tying=tying, kv=kv), TINY, V).eval()
    x = torch.randint(0, V, (2, 12))
    out = model(x)
    ref = full_forward_routed(model, x, out.routing.selected)
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)


def test_shared_kv_gets_gradient_from_every_recursion_and_vanilla_consumers_none():
    torch.manual_seed(0)
    model = build_model(tiny(tying="middle_cycle", kv="shared"), TINY, V)
    x = torch.randint(0, V, (2, 12))
    out = model(x, x)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert model.unique_layers[1].self_attn.k_proj.weight.grad.abs().sum() > 0
    vanilla = build_model(ModelConfig(scale="tiny", tying="sequence", kv="shared"), TINY, V)  # pairs
    vanilla(x, x).loss.backward()
    k_grads = [layer.self_attn.k_proj.weight.grad for layer in vanilla.unique_layers]
    assert [g is not None for g in k_grads] == [True, False, True, False]


# ------------------------------------------------------------------ the cache itself
def test_slot_appends_per_row_in_position_order_and_masks_the_rest():
    slot = KVSlot("t", batch=2, kv_heads=1, size=4, head_dim=2, dtype=torch.float32, device="cpu")
    k = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)  # (B, Hkv, n, hd)
    pos = torch.tensor([[5, 6, 7], [5, 6, 7]])
    valid = torch.tensor([[True, False, True], [False, False, True]])
    slot.append(k, k, pos, valid)
    assert slot.length.tolist() == [2, 1]
    assert slot.pos.tolist() == [[5, 7, EMPTY, EMPTY], [7, EMPTY, EMPTY, EMPTY]]
    torch.testing.assert_close(slot.k[0, 0, :2], k[0, 0, [0, 2]])
    m = slot.mask(torch.tensor([[6], [7]]), torch.ones(2, 1, dtype=torch.bool))  # (B, 1, 1, S)
    assert m[:, 0, 0].tolist() == [[True, False, False, False], [True, False, False, False]]
    with pytest.raises(RuntimeError, match="is full"):
        slot.append(k, k, pos + 3, torch.ones(2, 3, dtype=torch.bool))


def test_cache_misuse_fails_loudly():
    torch.manual_seed(0)
    model = build_model(tiny(kv="shared"), TINY, V).eval()
    x = torch.randint(0, V, (2, 6))
    with pytest.raises(RuntimeError, match="init_cache"):
        decode_step(model, None, x[:, 0])
    cache, _ = prefill(model, x, max_len=7)
    with pytest.raises(ValueError, match="batch size 1"):
        decode_step(model, cache, x[:1, 0])
    decode_step(model, cache, x[:, 0])  # fills the 7th and last position
    with pytest.raises(ValueError, match="max_len=7"):
        decode_step(model, cache, x[:, 1])
    other = build_model(tiny(kv="shared"), TINY, V).eval()
    with pytest.raises(RuntimeError, match="another model"):
        decode_step(other, cache, x[:, 0])
    with pytest.raises(ValueError, match="max_seq_len"):
        init_cache(model, 1, TINY.max_seq_len + 1)
    with pytest.raises(ValueError, match="one token per sequence"):
        decode_step(model, init_cache(model, 2, 8), x[:, :2])


def test_capacity_sized_cache_overflows_loudly_when_the_router_keeps_too_many():
    torch.manual_seed(0)
    model = build_model(tiny(), TINY, V).eval()
    for router in model.routers:
        router.causal_logits = lambda h, logits: torch.ones_like(logits)  # keep every token
    with pytest.raises(RuntimeError, match="sizing='full'"):
        prefill(model, torch.randint(0, V, (1, 12)), sizing="capacity")
    cache, _ = prefill(model, torch.randint(0, V, (1, 12)), sizing="full")
    assert (cache.depth == 3).all()


# ------------------------------------------------------------------ one KV layout
@pytest.mark.parametrize("router", ["expert_choice", "token_choice"])
@pytest.mark.parametrize("kv", ["recursion_wise", "shared", "shared_dagger"])
@pytest.mark.parametrize("sizing", ["full", "capacity"])
def test_memory_model_counts_the_layout_the_cache_allocates(router, kv, sizing):
    """mor.flops and the cache read one layout (kv_layout.cache_layout): the entries the
    memory model counts are the entries init_cache allocates, token-choice included (its
    design share is the balanced assignment, 3/3, 2/3, 1/3)."""
    from mor.flops import kv_cache_entries

    cfg = tiny(tying="middle_cycle", kv=kv, type=router)
    model = build_model(cfg, TINY, V)
    cache = init_cache(model, batch=1, max_len=24, sizing=sizing)
    assert sum(s.size for s in cache.slots.values()) == kv_cache_entries(cfg, TINY, 24, sizing)
    if sizing == "capacity" and kv == "recursion_wise":  # prefix, 3 recursions of 1 layer, suffix
        assert kv_cache_entries(cfg, TINY, 24, sizing) == 24 + 24 + 16 + 8 + 24
