"""Cached decoding equals the full causal forward, for every variant and KV strategy.

Prefill a prompt, decode the rest token by token, and compare every logit with
``full_forward_causal`` on the same prefix (fp32). MoR routers are given large weights so
the causal decision really splits tokens (asserted), otherwise a model that never routes
would pass trivially.
"""

import pytest
import torch

from helpers.decode import B, PROMPT, T, TINY, V, VARIANTS, cfg_id, make, routing_splits
from mor.config import ModelConfig, RouterConfig
from mor.model.decode import decode_step, full_forward_causal, generate, prefill
from mor.model.transformer import build_model


@pytest.mark.parametrize("cfg", VARIANTS, ids=cfg_id)
def test_cached_decoding_matches_full_causal_forward(cfg):
    model, x = make(cfg)
    ref = full_forward_causal(model, x)  # (B, T, V)
    if model.routers:
        depths = ref.routing.depths()
        assert routing_splits(ref) and depths.min() >= 1 and depths.max() <= cfg.num_recursions
    if not model.routers or cfg.router.type == "token_choice":  # training routing already causal:
        with torch.no_grad():  # the reference is the training forward itself
            torch.testing.assert_close(ref.logits, model(x).logits, rtol=1e-5, atol=1e-5)

    cache, logits = prefill(model, x[:, :PROMPT], max_len=T, all_logits=True)
    torch.testing.assert_close(logits, ref.logits[:, :PROMPT], rtol=1e-5, atol=1e-5)
    for t in range(PROMPT, T):
        step = decode_step(model, cache, x[:, t])  # (B, V)
        torch.testing.assert_close(step, ref.logits[:, t], rtol=1e-5, atol=1e-5)
    if model.routers:
        assert torch.equal(cache.depth, ref.routing.depths())  # every token got the reference depth

    _, last = prefill(model, x)  # last-position logits (may skip layers nothing reads)
    torch.testing.assert_close(last, ref.logits[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv", ["recursion_wise", "shared", "shared_dagger"])
def test_chunked_prefill_and_batch_rows_are_independent(kv):
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv)
    model, x = make(cfg, seed=1)
    ref = full_forward_causal(model, x).logits
    cache, _ = prefill(model, x[:, :3], max_len=T)
    _, chunk = prefill(model, x[:, 3:9], cache=cache, all_logits=True)  # appended to the cache
    torch.testing.assert_close(chunk, ref[:, 3:9], rtol=1e-5, atol=1e-5)
    # a sequence decoded alone gets the same logits as in the batch (per-row cache lengths)
    solo_cache, _ = prefill(model, x[1:, :PROMPT], max_len=T)
    for t in range(PROMPT, T):
        torch.testing.assert_close(decode_step(model, solo_cache, x[1:, t])[0], ref[1, t], rtol=1e-5, atol=1e-5)
    if kv == "recursion_wise":  # some recursion's slot holds fewer tokens than were fed
        assert min(int(s.length.min()) for s in solo_cache.slots.values()) < T


def _count_layer_tokens(model):
    """(recursion, tokens) of every run_layer call and every KV projection."""
    runs, kvs = [], []
    run, kv = model.run_layer, model.layer_kv

    def run_spy(layer_id, h, positions, recursion, **kw):
        runs.append((recursion, h.shape[1]))
        return run(layer_id, h, positions, recursion, **kw)

    def kv_spy(layer_id, h, positions, recursion):
        kvs.append((recursion, h.shape[1]))
        return kv(layer_id, h, positions, recursion)

    model.run_layer, model.layer_kv = run_spy, kv_spy
    return runs, kvs


@pytest.mark.parametrize("variant", ["recursive", "mor"])
def test_shared_cycle_prefill_runs_only_the_first_recursion(variant):
    """App. H: with KV sharing and Cycle tying, deeper recursions of the prompt's tokens are
    not needed; only the last token (whose logits are returned) runs them."""
    model, _ = make(ModelConfig(scale="tiny", variant=variant, tying="cycle", num_recursions=2, kv="shared"))
    runs, kvs = _count_layer_tokens(model)
    cache, _ = prefill(model, torch.randint(0, V, (B, T)), max_len=T + 1)
    assert {n for r, n in runs if r == 0} == {T}
    assert {n for r, n in runs if r == 1} <= {1}  # the last token only (MoR: if it was kept)
    assert all(r == 0 for r, _ in kvs)  # recursion 2 reads recursion 1's cache
    if variant == "mor":  # deeper decisions of the earlier prompt tokens were never made
        assert (cache.depth[:, : T - 1] == -1).all() and (cache.depth[:, T - 1] >= 1).all()
    runs.clear(), kvs.clear()
    decode_step(model, cache, torch.zeros(B, dtype=torch.long))
    assert all(r == 0 for r, _ in kvs)
    # Middle-Cycle has an unshared last layer whose cache needs every token at full depth
    mid, _ = make(ModelConfig(scale="tiny", variant=variant, tying="middle_cycle", num_recursions=2, kv="shared"))
    runs, _ = _count_layer_tokens(mid)
    prefill(mid, torch.randint(0, V, (B, T)))
    assert max(n for r, n in runs if r is None) == T and len([1 for r, _ in runs if r is None]) == 2


@pytest.mark.parametrize("aux", ["aux_loss", "aux_router"])
def test_causal_decision_is_causal_and_training_topk_is_not(aux):
    model, x = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                                router=RouterConfig(aux=aux)))
    t = 6
    base_causal = full_forward_causal(model, x).logits
    for v in range(0, V, 10):
        y = x.clone()
        y[:, t + 1:] = v
        torch.testing.assert_close(full_forward_causal(model, y).logits[:, : t + 1], base_causal[:, : t + 1])
    with torch.no_grad():
        base_topk = model(x).logits
        for v in range(V):  # some future tokens must push an earlier token out of a top-k
            y = x.clone()
            y[:, t + 1:] = v
            if not torch.allclose(model(y).logits[:, : t + 1], base_topk[:, : t + 1]):
                return
    raise AssertionError("top-k over the sequence should let a future token change an earlier logit")


def test_generate_is_greedy_over_the_reference():
    model, x = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv="shared"))
    prompt = x[:, :4]
    out = generate(model, prompt, max_new_tokens=5)
    assert out.shape == (B, 9) and torch.equal(out[:, :4], prompt)
    for t in range(4, 9):  # each new token is the argmax of the full causal forward on its prefix
        assert torch.equal(out[:, t], full_forward_causal(model, out[:, :t]).logits[:, -1].argmax(-1))


@pytest.mark.parametrize("variant", ["recursive", "mor"])
@pytest.mark.parametrize("relaxation", ["lora", "dora", "prefix", "recursion_pe"])
def test_decoding_with_relaxed_kv_sharing(variant, relaxation):
    """Table 16's relaxations on top of KV sharing decode like the full forward (LoRA/DoRA
    on k_proj/v_proj reach the cached keys through ``model.layer_kv``)."""
    cfg = ModelConfig(scale="tiny", variant=variant, tying="middle_cycle", num_recursions=3, kv="shared",
                      relaxation=relaxation, relaxation_rank=0 if relaxation == "recursion_pe" else 2)
    model, x = make(cfg)
    with torch.no_grad():  # move the relaxation off its identity init so it matters
        for p in model.relax.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref = full_forward_causal(model, x).logits
    if variant == "recursive":
        with torch.no_grad():
            torch.testing.assert_close(ref, model(x).logits, rtol=1e-5, atol=1e-5)
    cache, logits = prefill(model, x[:, :PROMPT], max_len=T, all_logits=True)
    torch.testing.assert_close(logits, ref[:, :PROMPT], rtol=1e-5, atol=1e-5)
    for t in range(PROMPT, T):
        torch.testing.assert_close(decode_step(model, cache, x[:, t]), ref[:, t], rtol=1e-5, atol=1e-5)


def test_positions_past_max_seq_len_fail_loudly():
    """RoPE does not bounds-check positions (a device sync per call): each entry point checks."""
    model = build_model(ModelConfig(scale="tiny"), TINY, V).eval()
    x = torch.randint(0, V, (1, TINY.max_seq_len + 1))
    for run in (model, lambda i: full_forward_causal(model, i), lambda i: prefill(model, i)):
        with pytest.raises(ValueError, match="max_seq_len"):
            run(x)


@pytest.mark.parametrize("cfg", [
    ModelConfig(scale="tiny", variant="mor", tying="cycle", num_recursions=3, kv=kv, router=RouterConfig(type=router))
    for kv in ("recursion_wise", "shared_dagger") for router in ("expert_choice", "token_choice")
], ids=cfg_id)
def test_long_prefill_with_chunked_masked_attention_matches_the_reference(cfg, monkeypatch):
    """At a 256-entry cache a long prompt's masked attention runs in query chunks over
    trimmed keys (mor.model.layers.masked_attention), in the cached prefill and in the
    reference; both equal the single-call results, and decoding goes on from there."""
    from mor.model import layers

    model, _ = make(cfg)
    n = TINY.max_seq_len
    x = torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(1))
    keys = []
    sdpa = layers.F.scaled_dot_product_attention
    monkeypatch.setattr(layers.F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: keys.append(k.shape[2]) or sdpa(q, k, v, **kw))
    ref = full_forward_causal(model, x)
    cache, logits = prefill(model, x[:, : n - 4], max_len=n, all_logits=True)
    assert min(keys) < n  # some chunk attended over a trimmed key prefix
    torch.testing.assert_close(logits, ref.logits[:, : n - 4], rtol=1e-5, atol=1e-5)
    for t in range(n - 4, n):
        torch.testing.assert_close(decode_step(model, cache, x[:, t]), ref.logits[:, t], rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(layers, "CHUNK_MIN_KEYS", 10**9)  # one call per attention
    torch.testing.assert_close(full_forward_causal(model, x).logits, ref.logits, rtol=1e-5, atol=1e-5)
