"""Validation scoring: NLL by hand, and the router material the figures read."""

import math

import numpy as np
import pytest
import torch

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.eval.nll import SAMPLE_WINDOWS, evaluate
from mor.model.transformer import build_model

SHAPE = load_scales()["tiny"]


def test_nll_matches_a_hand_computed_cross_entropy():
    torch.manual_seed(0)
    model = build_model(ModelConfig(scale="tiny"), SHAPE, 40)
    tokens = np.arange(3 * 9) % 40  # three windows of 8 + 1
    got = evaluate(model, tokens, seq_len=8, max_tokens=10_000, batch=2, device="cpu")
    w = torch.from_numpy(tokens.reshape(3, 9))
    with torch.no_grad():
        logits = model(w[:, :-1]).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), w[:, 1:].reshape(-1)).item()
    # Batches of 2 against one of 3: other GEMM shapes, other kernels, other last bits. A mean
    # of float32 cross-entropies is good to a few dozen ulps whatever the kernel (issue 54).
    assert got["val_nll"] == pytest.approx(want, rel=32 * torch.finfo(torch.float32).eps) and got["val_tokens"] == 24
    assert "mean_depth" not in got and math.isfinite(got["val_nll"])


@pytest.mark.parametrize("router", [RouterConfig(type="expert_choice"), RouterConfig(type="token_choice", func="softmax")])
def test_mor_eval_keeps_depths_and_router_histograms(router):
    torch.manual_seed(0)
    model = build_model(ModelConfig(scale="tiny", variant="mor", num_recursions=3, router=router), SHAPE, 40)
    tokens = np.random.default_rng(0).integers(0, 40, size=5 * 17)
    got = evaluate(model, tokens, seq_len=16, max_tokens=10_000, batch=2, device="cpu")
    assert got["sample_token_ids"] == tokens.reshape(5, 17)[:SAMPLE_WINDOWS, :-1].flatten().tolist()
    depths = got["sample_token_depths"]
    assert len(depths) == SAMPLE_WINDOWS * 16 and set(depths) <= {1, 2, 3}
    hist = got["router_output_hist"]
    assert len(hist) == 3
    for h in hist:
        for group in ("selected", "unselected"):
            total = sum(h[group])
            assert total == pytest.approx(1.0) or (total == 0 and h[f"n_{group}"] == 0)
    assert sum(got["depth_histogram"]) == 5 * 16


@pytest.mark.parametrize("router", [RouterConfig(type="expert_choice", aux="aux_loss"),
                                    RouterConfig(type="expert_choice", aux="aux_router"),
                                    RouterConfig(type="token_choice", func="softmax")])
def test_causal_nll_scores_the_windows_with_the_decoding_decision(router):
    """val_nll_causal = the cross-entropy of the logits cached decoding gives (prefill over each
    window); val_nll stays the teacher-forced top-k number (model(x))."""
    from mor.model.decode import prefill

    torch.manual_seed(0)
    model = build_model(ModelConfig(scale="tiny", variant="mor", num_recursions=3, router=router), SHAPE, 40).eval()
    tokens = np.random.default_rng(1).integers(0, 40, size=4 * 17)
    got = evaluate(model, tokens, seq_len=16, max_tokens=10_000, batch=3, device="cpu")
    w = torch.from_numpy(tokens.reshape(4, 17))
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        causal = torch.cat([prefill(model, w[i:i + 1, :-1], all_logits=True)[1] for i in range(4)])  # (4, 16, 40)
        topk = model(w[:, :-1]).logits
    assert got["val_nll_causal"] == pytest.approx(ce(causal.reshape(-1, 40), w[:, 1:].reshape(-1)).item(), rel=1e-5)
    assert got["val_nll"] == pytest.approx(ce(topk.reshape(-1, 40), w[:, 1:].reshape(-1)).item(), rel=1e-5)
    if router.type == "expert_choice":  # top-k over the window is not the causal decision
        assert got["val_nll"] != pytest.approx(got["val_nll_causal"], rel=1e-6)


def test_causal_nll_of_an_unrouted_model_is_its_nll():
    torch.manual_seed(0)
    model = build_model(ModelConfig(scale="tiny", variant="recursive", num_recursions=2), SHAPE, 40)
    got = evaluate(model, np.arange(3 * 9) % 40, seq_len=8, max_tokens=10_000, batch=2, device="cpu")
    assert got["val_nll_causal"] == got["val_nll"]
