"""Token-choice MoR: routing, packing, KV strategies, balancing, metrics, FLOPs, real-size shapes."""

import contextlib
import dataclasses
import math

import pytest
import torch

from helpers.tiny import VOCAB, tiny_run
from mor.config import EvalConfig, ModelConfig, RouterConfig, load_scales
from mor.flops import forward_flops_per_token, layer_params, param_count
from mor.model.router_losses import router_z_loss, token_choice_balance_loss
from mor.model.token_choice import depth_counts, partition, run_token_choice
from mor.model.transformer import RoutingTrace, build_model
from mor.train.trainer import Trainer

SCALES = load_scales()
KV = ("recursion_wise", "shared", "shared_dagger")


def tc_config(nr=3, kv="recursion_wise", tying="middle_cycle", scale="tiny", **router) -> ModelConfig:
    return ModelConfig(scale=scale, variant="mor", tying=tying, num_recursions=nr, kv=kv,
                       router=RouterConfig(type="token_choice", **router))


def tc_model(seed=0, vocab=50, **kw):
    torch.manual_seed(seed)
    return build_model(tc_config(**kw), SCALES["tiny"], vocab)


def spread_router(model, scale=3.0):
    """Larger router weights so a random model picks every depth (depth 1 and Nr both occur)."""
    with torch.no_grad():
        for p in model.routers[0].head.parameters():
            p.mul_(scale / p.std())


# ---------------------------------------------------------------------- packing
def test_partition_is_stable_and_dest_inverts():
    active = torch.tensor([[0, 1, 1, 0, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    perm, dest, count = partition(active)
    assert perm.tolist() == [[1, 2, 4, 0, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert count.tolist() == [3, 1, 0]
    assert torch.equal(perm.gather(1, dest), torch.arange(5).expand(3, 5))  # dest = inverse permutation


def test_depth_counts():
    assignment = torch.tensor([[0, 2, 2, 1], [1, 1, 1, 0]])
    run_max, run_total, stop_max = depth_counts(assignment, 3)
    assert run_max == [4, 3, 2] and run_total == [8, 6, 2] and stop_max == [1, 3, 2]


# ---------------------------------------------------------------------- routing
@pytest.mark.parametrize("func", ["softmax", "sigmoid", "tanh"])
def test_shapes_and_depths(func):
    nr = 3
    model = tc_model(nr=nr, func=func)
    spread_router(model)
    x = torch.randint(0, 50, (4, 24))
    out = model(x, x)
    tr = out.routing
    assert out.logits.shape == (4, 24, 50) and torch.isfinite(out.loss)
    assert tr.probs.shape == (4, 24, nr) and tr.assignment.shape == (4, 24)
    assert len(tr.selected) == len(tr.scores) == len(tr.candidates) == nr
    d = tr.depths()
    assert d.min() >= 1 and d.max() <= nr
    torch.testing.assert_close(d, tr.assignment + 1)
    assert set(d.unique().tolist()) == {1, 2, 3}, "spread router should use every depth"
    for r, sel in enumerate(tr.selected):  # depth d <=> exactly recursions 1..d
        assert torch.equal(sel, tr.assignment >= r)
        assert torch.equal(tr.candidates[r], tr.selected[r - 1] if r else torch.ones_like(sel))


def _reference(model, h, positions):
    """Per-sequence loop: the obvious, slow implementation the packed one must equal."""
    rcfg, kv_mode = model.cfg.router, model.cfg.kv
    router = model.routers[0]
    logits = router.logits(h)
    scores = router.scores(logits)
    assign = router.choose(router.probs(logits, scores))
    g = rcfg.alpha * scores.gather(-1, assign.unsqueeze(-1)).squeeze(-1)
    rows = []
    for b in range(h.shape[0]):
        x, pos = h[b : b + 1], positions[b : b + 1]
        kv1 = []
        for r, rec in enumerate(model.plan.recursions):
            idx = torch.nonzero(assign[b] >= r).flatten()
            if idx.numel() == 0:
                continue
            xs, ps = x[:, idx], pos[:, idx]
            mask = (pos.unsqueeze(1) <= ps.unsqueeze(2)).unsqueeze(1)  # (1, 1, k, T)
            for j, lid in enumerate(rec):
                layer = model.unique_layers[lid]
                if r == 0 and kv_mode != "recursion_wise":
                    kv1.append(layer.self_attn.project_kv(layer.input_layernorm(x), pos, model.rope))
                if kv_mode == "recursion_wise" or r == 0:
                    xs = layer(xs, ps, model.rope)  # ascending positions: plain causal attention
                elif kv_mode == "shared":
                    xs = layer(xs, ps, model.rope, kv=kv1[j], attn_mask=mask)
                else:
                    fk, fv = layer.self_attn.project_kv(layer.input_layernorm(xs), ps, model.rope)
                    k, v = kv1[j][0].clone(), kv1[j][1].clone()
                    k[:, :, idx], v[:, :, idx] = fk, fv
                    xs = layer(xs, ps, model.rope, kv=(k, v), attn_mask=mask)
            x = x.clone()
            x[:, idx] = xs
        rows.append(x)
    hd = torch.cat(rows)
    gate = g.unsqueeze(-1)
    return h + gate * hd if rcfg.gating == "weighted" else hd + gate


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("gating", ["weighted", "additive"])
def test_packed_recursions_equal_per_sequence_reference(kv, gating):
    model = tc_model(kv=kv, gating=gating, func="softmax").eval()
    spread_router(model)
    trace = _check_against_reference(model)
    assert any(sel.sum(1).unique().numel() > 1 for sel in trace.selected[1:]), "no padding exercised"


@pytest.mark.parametrize("forced", [0, 2])
def test_all_tokens_one_depth_equals_reference(forced):
    """Every token at depth 1 (recursions 2..Nr run on nobody) or at depth Nr (no packing)."""
    model = tc_model(balancing="loss_free").eval()
    with torch.no_grad():
        model.routers[0].bias[forced] = 10.0  # probs lie in [0, 1]: the bias decides
    trace = _check_against_reference(model)
    assert (trace.assignment == forced).all()


def _check_against_reference(model, B=3, T=20):
    """Outputs and gradients (input, every parameter) of the packed code equal the reference."""
    torch.manual_seed(1)
    h = torch.randn(B, T, model.shape.hidden)
    positions = torch.arange(T).expand(B, T)
    weight = torch.randn(B, T, model.shape.hidden)  # a loss whose gradient differs per token
    trace = RoutingTrace()
    grads = []
    for fn in (lambda x: run_token_choice(model, x, positions, trace)[0], lambda x: _reference(model, x, positions)):
        model.zero_grad(set_to_none=True)
        x = h.clone().requires_grad_(True)
        out = fn(x)
        (out * weight).sum().backward()
        params = [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
        grads.append([out.detach(), x.grad, *params])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    return trace


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("gating", ["weighted", "additive"])
def test_packed_gradients_equal_reference_over_several_boundaries(kv, gating):
    """Nr=4: padding rows carry stale states through two splits; none of it may reach a result."""
    model = tc_model(nr=4, tying="cycle", kv=kv, gating=gating, func="softmax").eval()
    spread_router(model)
    trace = _check_against_reference(model, B=4, T=24)
    assert all(sel.sum(1).unique().numel() > 1 for sel in trace.selected[1:]), "no padding exercised"


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("func", ["softmax", "sigmoid"])
def test_causality_every_kv_strategy(kv, func):
    """Changing token t+1 never changes the logits at positions <= t (train and eval decision)."""
    model = tc_model(kv=kv, func=func).eval()
    spread_router(model)
    x = torch.randint(0, 50, (3, 16))
    t = 7
    y = x.clone()
    y[:, t + 1] = (y[:, t + 1] + 11) % 50
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a.logits[:, : t + 1], b.logits[:, : t + 1])
    assert not torch.allclose(a.logits[:, t + 1 :], b.logits[:, t + 1 :])
    assert torch.equal(a.routing.assignment[:, : t + 1], b.routing.assignment[:, : t + 1])


@pytest.mark.parametrize("planted", [None, 1.01], ids=["true", "planted-1pct"])
@pytest.mark.parametrize("gating", ["weighted", "additive"])
def test_router_gradient_matches_finite_differences(gating, planted):
    """Autograd's router gradient along a random direction equals the extrapolated central
    difference (float64) within the difference's own error: the gate (its custom backward
    included) carries the loss's true derivative to the router. The check resolves 0.1 %, and a
    gate backward planted 1 % wrong fails it."""
    from helpers.gradients import directional_check, float64_norms, lm_loss64, planted_gate_error

    model = tc_model(gating=gating).double()
    x = torch.randint(0, 50, (2, 12))
    params = list(model.routers[0].head.parameters())
    plant = planted_gate_error(planted, custom_backward=gating == "weighted") if planted else contextlib.nullcontext()
    with float64_norms(), plant:
        check = directional_check(model, params, lambda: lm_loss64(model, x))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    assert abs(check.autograd) > 1e-9, "a zero directional derivative would compare nothing"
    assert check.resolution < 1e-3, f"the check cannot resolve a 1 % error: {check}"
    if planted:
        assert not check.agrees and check.autograd / check.reference == pytest.approx(planted, rel=1e-3), check
    else:
        assert check.agrees, check


# ---------------------------------------------------------------------- losses
def test_balancing_loss_on_off():
    x = torch.randint(0, 50, (3, 16))
    on = tc_model(balancing="loss", balance_coeff=0.1)
    off = tc_model(balancing="loss", balance_coeff=0.0)
    a, b = on(x, x), off(x, x)
    torch.testing.assert_close(a.lm_loss, b.lm_loss)  # same weights, same routing
    expected = 0.1 * token_choice_balance_loss(a.routing.probs, a.routing.assignment, 3)
    torch.testing.assert_close(a.aux_loss, expected)
    assert b.aux_loss.item() == 0.0 and a.loss.item() > b.loss.item()
    assert tc_model(balancing="loss_free")(x, x).aux_loss.item() == 0.0
    on.eval()
    assert on(x, x).aux_loss.item() == 0.0  # router losses are training-only


def test_z_loss_contributes():
    x = torch.randint(0, 50, (3, 16))
    with_z, without = tc_model(z_loss_coeff=0.01), tc_model(z_loss_coeff=0.0)
    seen = []
    with_z.routers[0].head.register_forward_hook(lambda mod, inp, out: seen.append(out))
    a, b = with_z(x, x), without(x, x)
    logits = seen[0] / with_z.cfg.router.temperature  # (B, T, Nr)
    torch.testing.assert_close(a.aux_loss - b.aux_loss, 0.01 * router_z_loss(logits))
    assert a.aux_loss > b.aux_loss


def test_balancing_warmup_sends_every_token_through_all_recursions():
    model = tc_model(balancing="loss_free", capacity_warmup_steps=4).train()
    spread_router(model)
    x = torch.randint(0, 50, (3, 16))
    model.capacity_scale = 0.5
    out = model(x, x)
    assert (out.routing.depths() == 3).all() and model.routers[0].pending_load is None
    model.capacity_scale = 1.0
    out = model(x, x)
    assert (out.routing.depths() < 3).any() and int(model.routers[0].pending_load.sum()) == 3 * 16


# ---------------------------------------------------------------------- training state
def _tokens(data_root):
    return data_root / "tokens" / f"train-bpe-{VOCAB}.npy"


def test_loss_free_bias_moves_and_survives_checkpoints(data_root, tmp_path):
    rate = 0.01
    run = tiny_run(variant="mor", nr=3, steps=4, batch=2, seq_len=16,
                   router=RouterConfig(type="token_choice", balancing="loss_free", bias_update_rate=rate))
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, micro_batch=1))  # 2 micro-batches a step
    tr = Trainer(run, tmp_path / "r", _tokens(data_root), VOCAB, progress=False)
    router = tr.model.routers[0]
    assert not router.bias.requires_grad and torch.equal(router.bias, torch.zeros(3))
    loads, update = [], router.after_optimizer_step

    def spy():
        loads.append(router.pending_load.clone())
        update()

    router.after_optimizer_step = spy
    moved = []
    for _ in range(3):
        before = router.bias.detach().clone()
        tr.train_step()
        load = loads[-1].float()
        assert load.sum().item() == 2 * 16  # both micro-batches' tokens, each counted once
        torch.testing.assert_close(router.bias.detach(), before + rate * torch.sign(load.sum() / 3 - load))
        moved.append(not torch.equal(router.bias, before))
    assert moved[0] and router.pending_load is None  # a random router is never exactly balanced
    assert router.bias.abs().max().item() > 0  # so the restore below is not zeros == zeros
    tr.save()
    again = Trainer(run, tmp_path / "r", _tokens(data_root), VOCAB, progress=False)
    assert torch.equal(again.model.routers[0].bias, torch.zeros(3))
    assert again.resume() and again.step == 3
    torch.testing.assert_close(again.model.routers[0].bias, router.bias)


def test_eval_records_token_choice_metrics(data_root):
    from mor.data.sampler import load_tokens
    from mor.eval.nll import evaluate

    model = tc_model(vocab=VOCAB).eval()
    spread_router(model)
    val = load_tokens(data_root / "tokens" / f"val-bpe-{VOCAB}.npy")
    m = evaluate(model, val, seq_len=32, max_tokens=32 * 16, batch=8, device="cpu")
    assert 0.0 <= m["max_vio"] <= 2.0  # (max load - N/3) / (N/3) <= Nr - 1
    assert 0.0 < m["entropy"] <= math.log(3) + 1e-9
    assert sum(m["depth_histogram"]) == m["val_tokens"] and 1.0 <= m["mean_depth"] <= 3.0
    assert "dead_token_ratio" not in m and "sampling_accuracy" not in m
    ec = build_model(ModelConfig(scale="tiny", variant="mor", num_recursions=3), SCALES["tiny"], VOCAB)
    m_ec = evaluate(ec, val, seq_len=32, max_tokens=32 * 8, batch=8, device="cpu")
    assert {"dead_token_ratio", "sampling_accuracy"} <= set(m_ec) and "max_vio" not in m_ec


def test_eval_job_writes_max_vio_and_entropy(data_root, tmp_path, monkeypatch):
    import types

    import mor.eval.job as jobs
    from mor.results import read_rows

    run = tiny_run(variant="mor", nr=3, steps=2, batch=4,
                   router=RouterConfig(type="token_choice", balancing="loss_free"))
    run = dataclasses.replace(run, eval=EvalConfig(nll_tokens=256, batch=4))
    Trainer(run, tmp_path / "r", _tokens(data_root), VOCAB, progress=False).fit()
    grid = types.SimpleNamespace(name="test", run=lambda run_id: types.SimpleNamespace(config=run))
    monkeypatch.setattr(jobs, "load_grid", lambda path, mode: grid)
    jobs.eval_job("grid.yaml", run.run_id, "local", str(tmp_path / "r"), str(tmp_path / "row.parquet"),
                  data_root=str(data_root), device="cpu")
    row = read_rows(tmp_path / "row.parquet").to_pylist()[0]
    assert row["router_type"] == "token_choice"
    assert row["max_vio"] is not None and row["max_vio"] >= 0
    assert 0 < row["entropy"] <= math.log(3) + 1e-9
    assert row["dead_token_ratio"] is None


# ---------------------------------------------------------------------- real size, FLOPs
@pytest.mark.parametrize("balancing", ["loss", "loss_free"])
def test_real_size_360m_wide_mlp_on_meta(balancing):
    cfg = tc_config(scale="360M", arch="wide_mlp", balancing=balancing, func="sigmoid")
    model = build_model(cfg, SCALES["360M"], 49152, device="meta")
    assert len(model.routers) == 1
    assert model.routers[0].head[-1].weight.shape == (3, 4 * 960)
    assert model.num_params() == param_count(cfg, SCALES["360M"], 49152)


def test_token_choice_flops_assume_balanced_depths():
    s, T = SCALES["135M"], 2048
    tc = forward_flops_per_token(tc_config(scale="135M", tying="cycle"), s, 49152, T)
    ec = forward_flops_per_token(ModelConfig(scale="135M", variant="mor", tying="cycle", num_recursions=3), s, 49152, T)
    rec = forward_flops_per_token(ModelConfig(scale="135M", variant="recursive", tying="cycle", num_recursions=3),
                                  s, 49152, T)
    router_diff = 2 * 576 * 3 - 3 * 2 * 576  # one Nr-output head vs Nr one-output heads: equal
    assert tc == pytest.approx(ec + router_diff) and tc < rec


def test_shared_kv_flops_follow_the_cost_table():
    s, T = SCALES["135M"], 2048
    mm = 2 * (layer_params(s) - 2 * 576)
    attn = 4 * 576 * T
    kv_mm = 2 * 2 * 576 * 3 * 64
    per = 10  # cycle: 30 layers = 3 recursions of 10
    base = 2 * 576 * 49152 + 2 * 576 * 3
    fr = [1, 2 / 3, 1 / 3]
    rw = forward_flops_per_token(tc_config(scale="135M", tying="cycle"), s, 49152, T)
    sh = forward_flops_per_token(tc_config(scale="135M", tying="cycle", kv="shared"), s, 49152, T)
    dg = forward_flops_per_token(tc_config(scale="135M", tying="cycle", kv="shared_dagger"), s, 49152, T)
    assert rw == pytest.approx(base + per * sum(f * mm + f * f * attn for f in fr))
    assert sh == pytest.approx(base + per * (mm + attn + sum(f * (mm - kv_mm) + f * attn for f in fr[1:])))
    assert dg == pytest.approx(base + per * (mm + attn + sum(f * mm + f * attn for f in fr[1:])))
    assert sh < dg


def test_expert_load_counts_as_bincount_with_a_shape_fake_tensors_know():
    """The balancing loss's and the loss-free bias's token counts per recursion: bincount's counts
    (an independent count), and a fixed output shape, so the rehearsal's fake tensors can run the
    token-choice forward (bincount's output length is data-dependent: fake tensors refuse it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mor.model.router_losses import expert_load

    g = torch.Generator().manual_seed(0)
    for n in (1, 3, 4):
        a = torch.randint(0, n, (257,), generator=g)
        want = torch.tensor([int((a == i).sum()) for i in range(n)])
        assert torch.equal(expert_load(a, n, torch.long), want)
        assert torch.equal(expert_load(a, n), want.float())
    with FakeTensorMode():
        fake = torch.randint(0, 3, (64,))
        with pytest.raises(Exception):
            torch.bincount(fake, minlength=3)  # what the rehearsal failed on
        assert tuple(expert_load(fake, 3).shape) == (3,)
