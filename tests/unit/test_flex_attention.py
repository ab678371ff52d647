"""Masked training attention through FlexAttention (mor.model.flex, issue 60): the same values
as the chunked SDPA path, forward and gradients, on the tying x KV grid and under prefix
relaxation; the one decision of which path runs; and a path that cannot silently not be taken.

torch 2.13 has no FlexAttention backward on CPU (its public entry refuses ``requires_grad``
inputs there). The gradient comparisons lift that check inside the test only, so torch's own
eager FlexAttention backward (the reference the GPU kernel is held to) runs on our block masks.
"""

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.model import layers
from mor.model.flex import flex_available, flex_masked_attention, masked_path, masked_path_override
from mor.model.transformer import build_model
from mor.train.execution import apply_execution

TINY = load_scales()["tiny"]  # C=32, 4 heads, 2 KV heads
V = 50
T = 160  # two 128-wide blocks: a partial block on each axis
TYINGS = ["cycle", "sequence", "middle_cycle", "middle_sequence"]
KVS = ["recursion_wise", "shared", "shared_dagger"]
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32


@pytest.fixture
def cpu_flex_backward(monkeypatch):
    """Let torch's eager FlexAttention run its backward on CPU (module docstring)."""
    monkeypatch.setattr(torch_flex, "_validate_device", lambda q, k, v: None)


def _spy(monkeypatch) -> dict[str, int]:
    """Counts of masked attention calls per path."""
    calls = {"flex": 0, "sdpa": 0}
    flex, sdpa = layers.flex_masked_attention, layers.masked_attention

    def on_flex(*a):
        calls["flex"] += 1
        return flex(*a)

    def on_sdpa(*a):
        calls["sdpa"] += 1
        return sdpa(*a)

    monkeypatch.setattr(layers, "flex_masked_attention", on_flex)
    monkeypatch.setattr(layers, "masked_attention", on_sdpa)
    return calls


def _loss_and_grads(model, x, path: str):
    model.zero_grad()
    with masked_path_override(path):
        loss = model(x, x).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_paths_agree(cfg, monkeypatch, masked: bool, seq: int = T):
    torch.manual_seed(0)
    model = build_model(cfg, TINY, V)
    x = torch.randint(0, V, (2, seq), generator=torch.Generator().manual_seed(1))
    calls = _spy(monkeypatch)
    ref_loss, ref_grads = _loss_and_grads(model, x, "sdpa")
    sdpa_calls = calls["sdpa"]
    loss, grads = _loss_and_grads(model, x, "flex")
    # every masked call of the flex run took flex, as many as the SDPA run made
    assert calls == {"flex": sdpa_calls, "sdpa": sdpa_calls}
    assert (sdpa_calls > 0) == masked, f"{sdpa_calls} masked attention calls"
    torch.testing.assert_close(loss, ref_loss, **TOL)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("tying", TYINGS)
def test_flex_equals_chunked_sdpa_on_the_tying_kv_grid(tying, kv, monkeypatch, cpu_flex_backward):
    """MoR (expert-choice, Nr=3): the shared recursions' routed queries attend over recursion
    1's keys under the staircase mask; recursion-wise caching has no mask (no masked call)."""
    cfg = ModelConfig(scale="tiny", variant="mor", tying=tying, num_recursions=3, kv=kv,
                      router=RouterConfig(type="expert_choice"))
    _check_paths_agree(cfg, monkeypatch, masked=kv != "recursion_wise")


@pytest.mark.parametrize("kv", ["shared", "shared_dagger"])
def test_flex_equals_the_sdpa_path_where_it_chunks(kv, monkeypatch, cpu_flex_backward):
    """At 256 tokens the SDPA path splits the routed queries into chunks over trimmed keys
    (``layers.masked_attention``); FlexAttention still gives its loss and gradients."""
    keys = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        keys.append(k.shape[2])
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", spy)
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv,
                      router=RouterConfig(type="expert_choice"))
    _check_paths_agree(cfg, monkeypatch, masked=True, seq=TINY.max_seq_len)
    assert min(keys) < TINY.max_seq_len  # chunks over trimmed key prefixes ran


@pytest.mark.parametrize("kv", ["shared", "shared_dagger"])
def test_flex_equals_chunked_sdpa_under_token_choice_padding(kv, monkeypatch, cpu_flex_backward):
    """Token-choice packs each recursion's tokens with padding rows (``valid``): masked always."""
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv,
                      router=RouterConfig(type="token_choice"))
    _check_paths_agree(cfg, monkeypatch, masked=True)


@pytest.mark.parametrize(("variant", "kv"), [("recursive", "recursion_wise"), ("recursive", "shared"),
                                             ("mor", "recursion_wise"), ("mor", "shared")])
def test_flex_equals_chunked_sdpa_under_prefix_relaxation(variant, kv, monkeypatch, cpu_flex_backward):
    """The prefix's all-True key columns before the causal (or staircase) part; its learned
    keys/values get their gradients through both paths alike."""
    cfg = ModelConfig(scale="tiny", variant=variant, tying="middle_cycle", num_recursions=3, kv=kv,
                      relaxation="prefix", relaxation_rank=4)
    _check_paths_agree(cfg, monkeypatch, masked=True)


def test_flex_kernel_matches_sdpa_on_a_per_head_mask_without_autograd():
    """The public CPU entry (no autograd, as at inference): a mask per sequence and head, with
    a row broadcast over queries."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 150, 8, generator=g)  # (B, H, Tq, hd)
    k, v = torch.randn(2, 2, 300, 8, generator=g), torch.randn(2, 2, 300, 8, generator=g)  # (B, Hkv, S, hd)
    mask = torch.rand(2, 4, 150, 300, generator=g) < 0.3
    mask[..., 0] = True  # no empty row
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(flex_masked_attention(q, k, v, mask, gqa=True), ref, **TOL)
    row = (torch.arange(300) < 120).expand(1, 1, 1, 300)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=row, enable_gqa=True)
    torch.testing.assert_close(flex_masked_attention(q, k, v, row, gqa=True), ref, **TOL)


def test_this_torch_provides_flex_attention():
    """The pinned torch (2.13) has FlexAttention: its import must not fail quietly into the fallback."""
    assert flex_available()


@pytest.mark.parametrize(("backend", "device", "grad", "bool_mask", "path"), [
    ("auto", "cuda", True, True, "flex"),  # CUDA training: the block masks
    ("flash", "cuda", True, True, "flex"),  # flash-attn is for the causal square; masks as auto
    ("auto", "cpu", True, True, "sdpa"),  # no CPU backward in torch
    ("auto", "cpu", False, True, "sdpa"),  # CPU forward measured slower (docs/speed.md)
    ("auto", "cuda", False, True, "sdpa"),  # inference: the decode cache's masks
    ("auto", "cuda", True, False, "sdpa"),  # additive masks
    ("sdpa", "cuda", True, True, "sdpa"),  # the fallback forced
    ("flex", "cuda", False, True, "flex"),
    ("flex", "cpu", False, True, "flex"),
])
def test_masked_path_decision(backend, device, grad, bool_mask, path):
    assert masked_path(backend, device, grad, bool_mask) == path


def test_flex_in_cpu_training_is_refused_with_a_reason():
    with pytest.raises(RuntimeError, match="no FlexAttention backward on CPU"):
        masked_path("flex", "cpu", True)


def test_override_wins_and_unwinds():
    with masked_path_override("sdpa"):
        assert masked_path("auto", "cuda", True) == "sdpa"
        with masked_path_override("flex"):
            assert masked_path("sdpa", "cpu", False) == "flex"
        assert masked_path("flex", "cuda", True) == "sdpa"
    assert masked_path("auto", "cuda", True) == "flex"
    with pytest.raises(ValueError, match="masked attention path"):
        with masked_path_override("flash"):
            pass


def test_the_layers_ask_the_decision_with_their_backend_device_and_grad(monkeypatch):
    """The attention hands ``masked_path`` what it decides on: a backend set by
    ``apply_execution``, the queries' device, and whether autograd records the call."""
    asked = []

    def record(backend, device, grad, bool_mask=True):
        asked.append((backend, device, grad, bool_mask))
        return "sdpa"

    monkeypatch.setattr(layers, "masked_path", record)
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv="shared",
                      router=RouterConfig(type="expert_choice"))
    torch.manual_seed(0)
    model = build_model(cfg, TINY, V)
    apply_execution(model, attention="flex")
    x = torch.randint(0, V, (2, 64))
    model(x, x)
    with torch.no_grad():
        model(x, x)
    assert asked and set(asked) == {("flex", "cpu", True, True), ("flex", "cpu", False, True)}


def test_the_rehearsal_measures_the_chunked_sdpa_path():
    """Under fake tensors masked attention is pinned to the chunked SDPA path (mor.rehearsal.fake)."""
    from mor.rehearsal.fake import fake_device

    with fake_device("run", "train", device="cpu"):
        assert masked_path("auto", "cuda", True) == "sdpa"
        assert masked_path("flex", "cpu", True) == "sdpa"
    assert masked_path("auto", "cuda", True) == "flex"
