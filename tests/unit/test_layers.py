"""Attention building blocks: ``masked_attention`` (query chunks over trimmed key prefixes)
must equal one SDPA call under the same mask, in outputs and gradients, and must actually
trim keys where a chunk's rows cannot see them."""

import pytest
import torch
import torch.nn.functional as F

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.model import layers
from mor.model.layers import masked_attention
from mor.model.transformer import build_model

B, H, HKV, HD = 2, 4, 2, 8


def _qkv(tq: int, s: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, tq, HD, generator=g, requires_grad=True)
    k = torch.randn(B, HKV, s, HD, generator=g, requires_grad=True)
    v = torch.randn(B, HKV, s, HD, generator=g, requires_grad=True)
    return q, k, v


def staircase(s: int, tq: int, seed: int = 0) -> torch.Tensor:
    """(B, 1, tq, s): tq routed queries at sorted random positions, each seeing keys <= its own."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(B, s, generator=g).topk(tq, dim=1).indices.sort(1).values  # (B, tq)
    return (torch.arange(s) <= pos.unsqueeze(-1)).unsqueeze(1)  # (B, 1, tq, s)


def _key_lengths(monkeypatch) -> list[int]:
    seen: list[int] = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append(k.shape[2])
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", spy)
    return seen


def _check_equal_to_one_call(q, k, v, mask):
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out = masked_attention(q, k, v, mask, gqa=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    w = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad((ref * w).sum(), (q, k, v)), torch.autograd.grad((out * w).sum(), (q, k, v))):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_staircase_mask_is_chunked_over_trimmed_keys_and_exact(monkeypatch):
    s, tq = 300, 150
    q, k, v = _qkv(tq, s)
    mask = staircase(s, tq)
    calls = _key_lengths(monkeypatch)
    _check_equal_to_one_call(q, k, v, mask)
    chunked = calls[1:]  # calls[0] is the reference call
    assert len(chunked) == -(-tq // layers.QUERY_CHUNK)
    assert chunked == sorted(chunked) and chunked[0] < s  # early chunks see a shorter key prefix
    c = layers.QUERY_CHUNK
    assert chunked == [int(mask[..., i : i + c, :].nonzero()[:, -1].max()) + 1 for i in range(0, tq, c)]


def test_any_bool_mask_is_exact_even_when_not_a_staircase():
    s, tq = 260, 130
    q, k, v = _qkv(tq, s, seed=1)
    mask = torch.rand(B, 1, tq, s, generator=torch.Generator().manual_seed(2)) < 0.3
    mask[..., :5, 200:] = False  # the first chunk cannot see the tail: trimmed
    mask[..., 0] = True  # no empty row
    _check_equal_to_one_call(q, k, v, mask)


def test_mask_broadcast_over_queries_and_batch_is_exact():
    s, tq = 256, 100
    q, k, v = _qkv(tq, s, seed=3)
    mask = (torch.arange(s) < 120).expand(1, 1, 1, s)  # every query sees the first 120 keys
    _check_equal_to_one_call(q, k, v, mask)


@pytest.mark.parametrize(("tq", "s", "full_rows"), [(150, 200, False), (40, 300, False), (150, 300, True)])
def test_one_call_when_chunking_cannot_pay(monkeypatch, tq, s, full_rows):
    """Too few keys, too few queries, or every chunk needs every key: a single SDPA call."""
    q, k, v = _qkv(tq, s)
    mask = staircase(s, tq)
    if full_rows:
        mask = mask.clone()
        mask[..., :: layers.QUERY_CHUNK, :] = True  # one row per chunk sees all keys
    calls = _key_lengths(monkeypatch)
    masked_attention(q, k, v, mask, gqa=True)
    assert calls == [s]


def test_float_masks_are_never_chunked(monkeypatch):
    q, k, v = _qkv(150, 300)
    additive = torch.zeros(B, 1, 150, 300).masked_fill(~staircase(300, 150), float("-inf"))
    calls = _key_lengths(monkeypatch)
    masked_attention(q, k, v, additive, gqa=True)
    assert calls == [300]


@pytest.mark.parametrize("router", ["expert_choice", "token_choice"])
@pytest.mark.parametrize("kv", ["shared", "shared_dagger"])
def test_kv_sharing_model_with_chunked_attention_matches_one_call(monkeypatch, router, kv):
    """At 256 tokens the shared recursions' attention is chunked; the loss and every
    gradient equal the single-call run."""
    shape = load_scales()["tiny"]
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv,
                      router=RouterConfig(type=router))
    x = torch.randint(0, 50, (2, shape.max_seq_len), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build_model(cfg, shape, 50)
    results = []
    for min_keys in (layers.CHUNK_MIN_KEYS, 10**9):
        monkeypatch.setattr(layers, "CHUNK_MIN_KEYS", min_keys)
        calls = _key_lengths(monkeypatch)
        model.zero_grad()
        loss = model(x, x).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], calls))
    (chunked_loss, chunked_grads, chunked_calls), (ref_loss, ref_grads, ref_calls) = results
    T = shape.max_seq_len
    assert set(ref_calls) == {T} and min(chunked_calls) < T  # the chunked run trimmed keys
    torch.testing.assert_close(chunked_loss, ref_loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(chunked_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
