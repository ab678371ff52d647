"""Hand-computed checks of the router metrics (App. G.2) and router losses (App. G.1)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mor.metrics.routing import (
    dead_token_ratio,
    depth_histogram,
    max_vio,
    router_output_histogram,
    sampling_accuracy,
    selection_entropy,
)
from mor.model.router_losses import (
    expert_choice_aux_bce,
    loss_free_bias_update,
    router_z_loss,
    token_choice_balance_loss,
)

# ---------------------------------------------------------------- router_z_loss


def test_z_loss_hand_computed_2x3():
    x = [[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]]
    lse = [math.log(sum(math.exp(v) for v in row)) for row in x]
    expected = (lse[0] ** 2 + lse[1] ** 2) / 2
    got = router_z_loss(torch.tensor(x))
    assert got.dim() == 0
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_z_loss_flattens_leading_dims():
    x = torch.randn(2, 5, 3)
    assert router_z_loss(x).item() == pytest.approx(router_z_loss(x.reshape(10, 3)).item(), rel=1e-6)


def test_z_loss_single_logit_per_token():
    z = torch.tensor([0.5, -2.0, 3.0])
    expected = (0.25 + 4.0 + 9.0) / 3  # logsumexp of one logit is the logit
    assert router_z_loss(z, per_token_scalar=True).item() == pytest.approx(expected, rel=1e-6)
    assert router_z_loss(z.unsqueeze(-1)).item() == pytest.approx(expected, rel=1e-6)
    zz = torch.tensor([[0.5, -2.0], [3.0, 1.0]])  # (batch, seq) of scalars
    assert router_z_loss(zz, per_token_scalar=True).item() == pytest.approx(14.25 / 4, rel=1e-6)


def test_z_loss_grad_and_bf16():
    x = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    router_z_loss(x).backward()
    assert x.grad is not None and torch.all(x.grad > 0)
    y = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    assert router_z_loss(y).dtype == torch.float32


def test_z_loss_errors():
    with pytest.raises(ValueError, match="logits"):
        router_z_loss(torch.tensor([1.0, 2.0]))  # ambiguous 1-D
    with pytest.raises(ValueError, match="logits"):
        router_z_loss(torch.zeros(0, 3))


# ---------------------------------------------------------------- expert_choice_aux_bce


def test_aux_bce_matches_torch_and_hand():
    z = torch.tensor([[2.0, -1.0, 0.0], [0.5, 3.0, -2.0]])
    sel = torch.tensor([[True, False, False], [False, True, True]])
    ref = F.binary_cross_entropy_with_logits(z, sel.float())
    got = expert_choice_aux_bce(z, sel)
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    hand = -(math.log(sig(2.0)) + math.log(1 - sig(-1.0)) + math.log(1 - sig(0.0))
             + math.log(1 - sig(0.5)) + math.log(sig(3.0)) + math.log(sig(-2.0))) / 6
    assert got.item() == pytest.approx(hand, rel=1e-6)


def test_aux_bce_single_token_log2_and_grad():
    z = torch.zeros(1, requires_grad=True)
    loss = expert_choice_aux_bce(z, torch.tensor([True]))
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    loss.backward()
    assert z.grad.item() == pytest.approx(-0.5)  # d/dz = sigmoid(z) - 1


def test_aux_bce_errors():
    with pytest.raises(ValueError, match="selected"):
        expert_choice_aux_bce(torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="selected"):
        expert_choice_aux_bce(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="router_logits"):
        expert_choice_aux_bce(torch.zeros(0), torch.zeros(0, dtype=torch.bool))


# ---------------------------------------------------------------- token_choice_balance_loss


def test_balance_loss_uniform_is_one():
    probs = torch.full((4, 2), 0.5)
    assert token_choice_balance_loss(probs, torch.tensor([0, 1, 0, 1]), 2).item() == pytest.approx(1.0)


def test_balance_loss_hand_computed():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.8, 0.1], [0.5, 0.25, 0.25]])
    assignment = torch.tensor([0, 0, 1, 0])
    f = [3 / 4, 1 / 4, 0.0]
    P = [1.9 / 4, 1.55 / 4, 0.55 / 4]
    expected = 3 * sum(fi * pi for fi, pi in zip(f, P))
    got = token_choice_balance_loss(probs, assignment, 3)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_balance_loss_collapsed_is_nr_and_grad_flows_through_probs():
    probs = torch.tensor([[1.0, 0.0], [1.0, 0.0]], requires_grad=True)
    loss = token_choice_balance_loss(probs, torch.tensor([0, 0]), 2)
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    # dL/dp[t, i] = Nr * f_i / N  -> f = (1, 0)
    assert torch.allclose(probs.grad, torch.tensor([[1.0, 0.0], [1.0, 0.0]]))


def test_balance_loss_errors():
    p = torch.full((4, 2), 0.5)
    with pytest.raises(ValueError, match="n_experts"):
        token_choice_balance_loss(p, torch.tensor([0, 1, 0, 1]), 0)
    with pytest.raises(ValueError, match="probs"):
        token_choice_balance_loss(p, torch.tensor([0, 1, 0, 1]), 3)
    with pytest.raises(ValueError, match="assignment"):
        token_choice_balance_loss(p, torch.tensor([0, 1, 0]), 2)
    with pytest.raises(ValueError, match="assignment"):
        token_choice_balance_loss(p, torch.tensor([0, 1, 0, 2]), 2)
    with pytest.raises(ValueError, match="assignment"):
        token_choice_balance_loss(p, torch.tensor([0.0, 1.0, 0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="assignment"):
        token_choice_balance_loss(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), 2)


# ---------------------------------------------------------------- loss_free_bias_update


def test_bias_update_direction():
    bias = torch.zeros(3)
    # loads (3, 1, 2), mean 2 -> expert 0 over (down), 1 under (up), 2 balanced (unchanged)
    new = loss_free_bias_update(bias, torch.tensor([0, 0, 0, 1, 2, 2]), 3, rate=0.1)
    assert torch.allclose(new, torch.tensor([-0.1, 0.1, 0.0]))
    assert torch.equal(bias, torch.zeros(3))  # not modified in place
    assert not new.requires_grad


def test_bias_update_accumulates_and_keeps_dtype():
    bias = torch.tensor([0.5, -0.5], dtype=torch.float64, requires_grad=True)
    new = loss_free_bias_update(bias, torch.tensor([[1, 1], [1, 0]]), 2, rate=0.25)
    assert new.dtype == torch.float64
    assert torch.allclose(new, torch.tensor([0.75, -0.75], dtype=torch.float64))


def test_bias_step_from_loads_equals_the_step_from_ids_and_an_empty_load_moves_nothing():
    """The router steps from its accumulated loads (no id list rebuilt from them, a data-dependent
    shape the rehearsal's fake tensors refuse): the same step as from the ids, loads (3, 1, 2)."""
    from mor.model.router_losses import bias_step_from_load

    bias = torch.tensor([0.2, -0.1, 0.0])
    ids = torch.tensor([0, 0, 0, 1, 2, 2])
    assert torch.equal(bias_step_from_load(bias, torch.tensor([3, 1, 2]), 0.1), loss_free_bias_update(bias, ids, 3, 0.1))
    assert torch.equal(bias_step_from_load(bias, torch.zeros(3, dtype=torch.long), 0.1), bias)
    with pytest.raises(ValueError, match="must match"):
        bias_step_from_load(bias, torch.tensor([1, 2]), 0.1)


def test_bias_update_errors():
    with pytest.raises(ValueError, match="bias"):
        loss_free_bias_update(torch.zeros(2), torch.tensor([0, 1]), 3, 0.1)
    with pytest.raises(ValueError, match="rate"):
        loss_free_bias_update(torch.zeros(2), torch.tensor([0, 1]), 2, -0.1)
    with pytest.raises(ValueError, match="assignment"):
        loss_free_bias_update(torch.zeros(2), torch.tensor([0, 5]), 2, 0.1)


# ---------------------------------------------------------------- max_vio


def test_max_vio_hand_computed():
    assert max_vio(np.array([0, 0, 0, 1]), 2) == pytest.approx(0.5)  # (3 - 2) / 2
    assert max_vio([0, 1, 2, 0, 1, 2], 3) == pytest.approx(0.0)
    assert max_vio(torch.tensor([[2, 2], [2, 2]]), 4) == pytest.approx(3.0)  # (4 - 1) / 1
    assert isinstance(max_vio([0, 1], 2), float)


def test_max_vio_errors():
    with pytest.raises(ValueError, match="n_experts"):
        max_vio([0, 0], 0)
    with pytest.raises(ValueError, match="assignment"):
        max_vio([], 2)
    with pytest.raises(ValueError, match="assignment"):
        max_vio([0, 2], 2)
    with pytest.raises(ValueError, match="assignment"):
        max_vio([0.0, 1.0], 2)


# ---------------------------------------------------------------- selection_entropy


def test_entropy_uniform_is_log_nr():
    assert selection_entropy(np.full((5, 4), 0.25)) == pytest.approx(math.log(4))


def test_entropy_hand_computed_with_zero_column():
    probs = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # p̄ = (0.5, 0.5, 0)
    assert selection_entropy(probs) == pytest.approx(math.log(2))
    probs = torch.tensor([[0.9, 0.1], [0.5, 0.5]])  # p̄ = (0.7, 0.3)
    assert selection_entropy(probs) == pytest.approx(-(0.7 * math.log(0.7) + 0.3 * math.log(0.3)))
    assert selection_entropy(np.array([[1.0, 0.0]])) == pytest.approx(0.0)


def test_entropy_normalize_for_sigmoid_probs():
    probs = np.array([[0.5, 0.5], [0.5, 0.5]])  # p̄ = (0.5, 0.5) already sums to 1
    assert selection_entropy(probs, normalize=True) == pytest.approx(math.log(2))
    probs = np.array([[0.2, 0.2]])  # normalised -> (0.5, 0.5)
    assert selection_entropy(probs, normalize=True) == pytest.approx(math.log(2))
    assert selection_entropy(probs) == pytest.approx(-2 * 0.2 * math.log(0.2))


def test_entropy_errors():
    with pytest.raises(ValueError, match="probs"):
        selection_entropy(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="probs"):
        selection_entropy(np.zeros((0, 2)))
    with pytest.raises(ValueError, match="probs"):
        selection_entropy(np.array([[-0.1, 1.1]]))


# ---------------------------------------------------------------- dead_token_ratio


def test_dead_token_ratio_2x3():
    sel = np.array([[True, False, False], [False, False, True]])  # position 1 never selected
    assert dead_token_ratio(sel) == pytest.approx(1 / 3)
    assert dead_token_ratio(torch.tensor(sel)) == pytest.approx(1 / 3)
    # fully position-fixed top-1/3 selection at Nr=3 -> 2/3 (the paper's 66.7%)
    fixed = np.array([[True, False, False]] * 4)
    assert dead_token_ratio(fixed) == pytest.approx(2 / 3)
    assert dead_token_ratio(np.ones((2, 3), dtype=bool)) == 0.0


def test_dead_token_ratio_errors():
    with pytest.raises(ValueError, match="selected_last"):
        dead_token_ratio(np.array([True, False]))
    with pytest.raises(ValueError, match="selected_last"):
        dead_token_ratio(np.array([[1, 0], [0, 1]]))
    with pytest.raises(ValueError, match="selected_last"):
        dead_token_ratio(np.zeros((0, 3), dtype=bool))


# ---------------------------------------------------------------- sampling_accuracy


def test_sampling_accuracy_hand_computed():
    pred = np.array([[True, False, True, True], [False, False, True, False]])
    topk = np.array([[True, True, True, False], [False, False, True, False]])
    assert sampling_accuracy(pred, topk) == pytest.approx(6 / 8)
    assert sampling_accuracy(torch.tensor(pred), torch.tensor(pred)) == 1.0


def test_sampling_accuracy_errors():
    with pytest.raises(ValueError, match="shape"):
        sampling_accuracy(np.ones((2, 3), bool), np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="pred_selected"):
        sampling_accuracy(np.ones((2,), int), np.ones((2,), bool))
    with pytest.raises(ValueError, match="topk_selected"):
        sampling_accuracy(np.ones((2,), bool), np.ones((2,), float))
    with pytest.raises(ValueError, match="pred_selected"):
        sampling_accuracy(np.zeros((0,), bool), np.zeros((0,), bool))


# ---------------------------------------------------------------- router_output_histogram


def test_router_output_histogram_hand_computed():
    scores = np.array([0.1, 0.2, 0.9, 0.95, 0.4])
    selected = np.array([False, False, True, True, False])
    h = router_output_histogram(scores, selected, bins=[0.0, 0.5, 1.0])
    assert h["bin_edges"] == [0.0, 0.5, 1.0]
    assert h["selected"] == [0.0, 1.0]
    assert h["unselected"] == [1.0, 0.0]
    assert (h["n_selected"], h["n_unselected"]) == (2, 3)


def test_router_output_histogram_int_bins_shared_edges():
    scores = torch.tensor([0.0, 0.25, 0.5, 1.0])
    selected = torch.tensor([False, False, True, True])
    h = router_output_histogram(scores, selected, bins=4)
    assert h["bin_edges"] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert h["selected"] == pytest.approx([0.0, 0.0, 0.5, 0.5])
    assert h["unselected"] == pytest.approx([0.5, 0.5, 0.0, 0.0])
    h = router_output_histogram(scores, torch.ones(4, dtype=torch.bool), bins=2, value_range=(0, 1))
    assert h["unselected"] == [0.0, 0.0] and sum(h["selected"]) == pytest.approx(1.0)


def test_router_output_histogram_errors():
    with pytest.raises(ValueError, match="selected"):
        router_output_histogram(np.ones(3), np.ones(4, bool))
    with pytest.raises(ValueError, match="bins"):
        router_output_histogram(np.ones(3), np.ones(3, bool), bins=0)
    with pytest.raises(ValueError, match="scores"):
        router_output_histogram(np.ones(0), np.ones(0, bool))


# ---------------------------------------------------------------- depth_histogram


def test_depth_histogram():
    assert depth_histogram([1, 3, 3, 2, 1, 1], 3) == [3, 1, 2]
    assert depth_histogram(torch.tensor([[1, 1], [1, 1]]), 4) == [4, 0, 0, 0]
    assert all(isinstance(v, int) for v in depth_histogram([1], 1))


def test_depth_histogram_errors():
    with pytest.raises(ValueError, match="n_recursions"):
        depth_histogram([1], 0)
    with pytest.raises(ValueError, match="depths"):
        depth_histogram([0, 1], 2)
    with pytest.raises(ValueError, match="depths"):
        depth_histogram([1, 3], 2)
    with pytest.raises(ValueError, match="depths"):
        depth_histogram([], 2)
