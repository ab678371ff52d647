"""balancing-entropy reads the depth assignments the router makes (issue 48): the eval's
``depth_histogram`` of a token-choice MoR counts top-1 of probs + the loss-free bias, the
same loads MaxVio counts, while the old ``entropy`` column averages the probabilities alone.
Checked on a real tiny model through ``mor.eval.nll.evaluate``."""

import math

import numpy as np
import pytest
import torch

from mor.claims.predicates import assignment_entropy
from mor.config import ModelConfig, RouterConfig, load_scales
from mor.eval.nll import evaluate
from mor.model.transformer import build_model


def _model():
    torch.manual_seed(0)
    router = RouterConfig(type="token_choice", func="softmax", balancing="loss_free")
    return build_model(ModelConfig(scale="tiny", variant="mor", num_recursions=3, router=router), load_scales()["tiny"], 40)


def test_a_bias_that_sends_every_token_to_one_depth_has_zero_assignment_entropy():
    """A loss-free bias of +10 on depth 3 sends every token there: the assignments' entropy is
    0 and MaxVio is (N - N/3) / (N/3) = 2, from the same loads; the probabilities' entropy, which
    leaves the bias out, stays near log 3 (a fresh router is near uniform)."""
    model = _model()
    tokens = np.random.default_rng(0).integers(0, 40, size=4 * 17)
    with torch.no_grad():
        model.routers[0].bias.copy_(torch.tensor([0.0, 0.0, 10.0]))
    got = evaluate(model, tokens, seq_len=16, max_tokens=10_000, batch=2, device="cpu")
    assert got["depth_histogram"] == [0, 0, 4 * 16]
    assert assignment_entropy(got["depth_histogram"]) == 0.0
    assert got["max_vio"] == pytest.approx(2.0)
    assert got["entropy"] > 0.9 * math.log(3)


def test_without_a_bias_the_assignments_are_the_probabilities_top_1():
    """Bias 0: the histogram is the count of each token's argmax probability, computed here by hand."""
    model = _model()
    tokens = np.random.default_rng(1).integers(0, 40, size=3 * 17)
    got = evaluate(model, tokens, seq_len=16, max_tokens=10_000, batch=3, device="cpu")
    out = model(torch.from_numpy(tokens.reshape(3, 17))[:, :-1])
    want = np.bincount(out.routing.probs.argmax(-1).flatten().numpy(), minlength=3)
    assert got["depth_histogram"] == want.tolist()
    q = want[want > 0] / want.sum()
    assert assignment_entropy(got["depth_histogram"]) == pytest.approx(float(-(q * np.log(q)).sum()))
