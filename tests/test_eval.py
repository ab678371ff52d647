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
    assert got["val_nll"] == pytest.approx(want, rel=1e-6) and got["val_tokens"] == 24
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
