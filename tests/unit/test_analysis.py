"""The analyses behind Figs. 1, 5b, 5c, 7, 8 and Table 17 (mor.analysis), each against an
independent computation: hand-computed numbers, or the model evaluated another way (the
masked reference forward of mor.model.decode, the layers called one by one, hooks on the
key / value projections)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mor.analysis.depth_cap import capped_nll, validation_windows
from mor.analysis.sidecar import read_sidecar, write_sidecar
from mor.analysis.kv_states import depth_labels, kv_states, kv_statistics, magnitude, pairwise_cosine
from mor.analysis.router_hist import histogram_bars, per_recursion
from mor.analysis.token_depths import group_by_depth, layout, token_pieces
from mor.config import ModelConfig, RouterConfig, load_scales
from mor.metrics.routing import router_output_histogram
from mor.model.decode import full_forward_causal, full_forward_routed
from mor.model.transformer import build_model

TINY = load_scales()["tiny"]
V, B, T = 50, 2, 12


def ec_model(nr=3, tying="middle_cycle", seed=0, **router):
    """A tiny expert-choice MoR model with decisive router logits (std-1 heads)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(scale="tiny", variant="mor", tying=tying, num_recursions=nr, router=RouterConfig(**router))
    model = build_model(cfg, TINY, V).eval()
    with torch.no_grad():
        for r in model.routers:
            for head in (r.head, getattr(r, "aux_head", None)):
                if head is not None:
                    torch.nn.init.normal_(head.weight, std=1.0)
    return model, torch.randint(0, V, (B, T))


# ----------------------------------------------------------------------------- depth cap
def manual_first_recursion(model, x):
    """MoR / Recursive with only recursion 1 applied, layer by layer: prefix, the first
    recursion's layers on every token (expert-choice: capacity 1, gated by the router weight),
    suffix, head."""
    pos = torch.arange(x.shape[1]).expand_as(x)
    h = model.embed_tokens(x)
    for i in model.plan.prefix:
        h = model.unique_layers[i](h, pos, model.rope)
    out = h
    for i in model.plan.recursions[0]:
        out = model.unique_layers[i](out, pos, model.rope)
    if model.routers:
        g = torch.sigmoid(model.routers[0].head(h).squeeze(-1)).unsqueeze(-1) * model.cfg.router.alpha  # (B, T, 1)
        # the authors' combine (default): h + g f(h), f the block with its residual; ours: h + g (f(h) - h)
        h = h + g * out if model.cfg.router.combine == "layer_output" else h + g * (out - h)
    else:
        h = out
    for i in model.plan.suffix:
        h = model.unique_layers[i](h, pos, model.rope)
    return F.linear(model.norm(h), model.embed_tokens.weight)


@pytest.mark.parametrize("tying", ["middle_cycle", "cycle"])
def test_depth_cap_one_is_the_first_recursion_alone(tying):
    model, x = ec_model(tying=tying)
    with torch.no_grad():
        capped = model(x, max_depth=1)
        assert torch.allclose(capped.logits, manual_first_recursion(model, x), atol=1e-5)
        assert len(capped.routing.selected) == 1 and bool(capped.routing.depths().eq(1).all())
        assert not torch.allclose(capped.logits, model(x).logits, atol=1e-3)  # the cap changes something


def test_recursive_depth_cap_one_is_the_first_recursion_alone():
    torch.manual_seed(1)
    model = build_model(ModelConfig(scale="tiny", variant="recursive", tying="middle_cycle", num_recursions=2), TINY, V).eval()
    x = torch.randint(0, V, (B, T))
    with torch.no_grad():
        assert torch.allclose(model(x, max_depth=1).logits, manual_first_recursion(model, x), atol=1e-5)
        assert torch.equal(model(x, max_depth=2).logits, model(x).logits)


@pytest.mark.parametrize("kv", ["recursion_wise", "shared"])
def test_depth_cap_keeps_the_models_own_routing_up_to_the_cap(kv):
    """Capped at d, the model equals the masked reference forward that keeps the full
    model's own top-k for recursions < d and no token after: the tokens bound deeper stop."""
    trained, x = ec_model()  # recursion-wise; the same weights under the KV strategy tested
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv)
    model = build_model(cfg, TINY, V).eval()
    model.load_state_dict(trained.state_dict())
    with torch.no_grad():
        full = model(x)
        selected = full.routing.selected
        assert 0 < int(selected[2].sum()) < int(selected[1].sum()) < B * T  # routing really splits
        for d in (1, 2, 3):
            keep = selected[:d] + [torch.zeros_like(selected[0])] * (3 - d)
            ref = full_forward_routed(model, x, keep)
            capped = model(x, max_depth=d)
            assert torch.allclose(capped.logits, ref.logits, atol=1e-5), d
            assert all(torch.equal(a, b) for a, b in zip(capped.routing.selected, selected[:d]))
        assert torch.equal(model(x, max_depth=3).logits, full.logits)


def test_causal_depth_cap_keeps_the_causal_decisions_up_to_the_cap():
    model, x = ec_model()
    with torch.no_grad():
        keep = full_forward_causal(model, x).routing.selected
        for d in (1, 2):
            capped = full_forward_causal(model, x, max_depth=d)
            ref = full_forward_routed(model, x, keep[:d] + [torch.zeros_like(keep[0])] * (3 - d))
            assert torch.allclose(capped.logits, ref.logits, atol=1e-5)


def test_token_choice_depth_cap_equals_the_causal_reference():
    """Token-choice routing is causal as trained: the packed forward capped at d equals the
    masked reference capped at d (tokens whose chosen depth is deeper stop at d)."""
    torch.manual_seed(3)
    cfg = ModelConfig(scale="tiny", variant="mor", tying="cycle", num_recursions=3,
                      router=RouterConfig(type="token_choice", func="softmax"))
    model = build_model(cfg, TINY, V).eval()
    torch.nn.init.normal_(model.routers[0].head.weight, std=1.0)
    x = torch.randint(0, V, (B, T))
    with torch.no_grad():
        depths = model(x).routing.depths()
        assert len(set(depths.flatten().tolist())) > 1
        for d in (1, 2, 3):
            capped = model(x, max_depth=d)
            assert torch.allclose(capped.logits, full_forward_causal(model, x, max_depth=d).logits, atol=1e-5)
            assert torch.equal(capped.routing.depths(), depths.clamp(max=d))


def test_bad_depth_caps_are_refused():
    model, x = ec_model(nr=2)
    for bad in (0, 3, 1.5, True):
        with pytest.raises(ValueError, match="max_depth must be an integer in 1..2"):
            model(x, max_depth=bad)


def test_capped_nll_is_the_cross_entropy_of_each_capped_model_and_val_nll_at_full_depth():
    from mor.eval.nll import evaluate

    model, _ = ec_model()
    tokens = np.random.default_rng(0).integers(0, V, size=5 * (T + 1) + 3)
    windows = validation_windows(tokens, T, 4 * T)
    assert windows.shape == (4, T + 1) and np.array_equal(windows.ravel(), tokens[: 4 * (T + 1)])
    r = capped_nll(model, windows, batch=3, device="cpu")
    w = torch.from_numpy(windows)
    with torch.no_grad():
        for d in (1, 2, 3):
            want = F.cross_entropy(model(w[:, :-1], max_depth=d).logits.reshape(-1, V), w[:, 1:].reshape(-1)).item()
            assert r["val_nll"][d - 1] == pytest.approx(want, abs=1e-5)
            causal = full_forward_causal(model, w[:, :-1], max_depth=d).logits
            assert r["val_nll_causal"][d - 1] == pytest.approx(
                F.cross_entropy(causal.reshape(-1, V), w[:, 1:].reshape(-1)).item(), abs=1e-5)
    full = evaluate(model, tokens, T, 4 * T, 3, "cpu")
    assert r["val_nll"][-1] == pytest.approx(full["val_nll"], abs=1e-6)
    assert r["val_nll_causal"][-1] == pytest.approx(full["val_nll_causal"], abs=1e-6)
    assert r["max_depth"] == [1, 2, 3] and r["tokens"] == 4 * T


# ----------------------------------------------------------------------------- KV states
def test_magnitude_and_cosine_by_hand():
    # L=2 depths, B=1, H=1, T=2 tokens, hd=2
    s = np.array([[[[[3.0, 4.0], [1.0, 0.0]]]], [[[[6.0, 8.0], [0.0, 1.0]]]]])
    assert s.shape == (2, 1, 1, 2, 2)
    assert np.allclose(magnitude(s), [[5.0, 1.0], [10.0, 1.0]])
    # token 0: parallel (cos 1); token 1: orthogonal (cos 0) -> mean 0.5
    assert np.allclose(pairwise_cosine(s), [[1.0, 0.5], [0.5, 1.0]])
    opposite = np.stack([s[0], -s[0]])
    assert np.allclose(pairwise_cosine(opposite), [[1.0, -1.0], [-1.0, 1.0]])
    with pytest.raises(ValueError, match=r"\(L, B, H, T, hd\)"):
        magnitude(s[0])


def test_kv_states_are_each_effective_layers_own_projections():
    """From the KV cache, against forward hooks on k_proj / v_proj during a plain forward
    (tied layers fire once per use, in effective-layer order). Values are the projections
    themselves; keys are RoPE-rotated, which keeps norms and same-position cosines."""
    torch.manual_seed(2)
    model = build_model(ModelConfig(scale="tiny", variant="recursive", tying="cycle", num_recursions=2), TINY, V).eval()
    x = torch.randint(0, V, (B, T))
    seen = {"k": [], "v": []}
    hooks = []
    for layer in model.unique_layers:
        for name in ("k", "v"):
            proj = getattr(layer.self_attn, f"{name}_proj")
            hooks.append(proj.register_forward_hook(lambda m, i, o, name=name: seen[name].append(o.detach())))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    L, hkv, hd = len(model.plan.order), TINY.kv_heads, TINY.head_dim
    assert len(seen["k"]) == len(seen["v"]) == L == 4
    ref = {n: np.stack([o.view(B, T, hkv, hd).transpose(1, 2).numpy() for o in seen[n]]) for n in seen}
    keys, values = kv_states(model, x)
    assert keys.shape == values.shape == (L, B, hkv, T, hd)
    assert np.allclose(values, ref["v"], atol=1e-5)
    stats = kv_statistics(keys, values)
    assert np.allclose(stats["key_magnitude"], np.linalg.norm(ref["k"], axis=-1).mean(axis=(1, 2)), atol=1e-5)
    unit = ref["k"] / np.linalg.norm(ref["k"], axis=-1, keepdims=True)
    for i in range(L):
        for j in range(L):
            assert stats["key_cosine"][i, j] == pytest.approx((unit[i] * unit[j]).sum(-1).mean(), abs=1e-5)
    assert np.allclose(np.diag(stats["value_cosine"]), 1.0, atol=1e-6)
    assert depth_labels(model.plan) == ["r1.L0", "r1.L1", "r2.L0", "r2.L1"]


def test_kv_states_refuse_mor_and_shared_kv():
    model, x = ec_model()
    with pytest.raises(ValueError, match="Vanilla or Recursive"):
        kv_states(model, x)
    shared = build_model(ModelConfig(scale="tiny", variant="recursive", tying="cycle", num_recursions=2, kv="shared"),
                         TINY, V).eval()
    with pytest.raises(ValueError, match="recursion_wise"):
        kv_states(shared, x)


# ----------------------------------------------------------------------------- tokens by depth
DECODE = {1: "a", 2: "b", 3: "c", 4: "\n"}.__getitem__


def decode(ids):
    return "".join(DECODE(i) for i in ids)


def test_group_by_depth_by_hand():
    ids, depths = [1, 2, 1, 3, 1, 2], [1, 2, 2, 3, 1, 2]
    g = group_by_depth(ids, depths, decode, 3)
    assert [x["depth"] for x in g] == [1, 2, 3] and [x["n"] for x in g] == [2, 3, 1]
    assert g[1]["share"] == pytest.approx(0.5)
    assert g[0]["tokens"] == [("a", 2, pytest.approx(2 / 3))]
    assert g[1]["tokens"] == [("b", 2, 1.0), ("a", 1, pytest.approx(1 / 3))]  # by count, then text
    assert g[2]["tokens"] == [("c", 1, 1.0)]
    with pytest.raises(ValueError, match="1..2"):
        group_by_depth(ids, depths, decode, 2)
    with pytest.raises(ValueError, match="6 token ids but 5 depths"):
        token_pieces(ids, depths[:5], decode)


def test_layout_wraps_at_width_and_breaks_at_newlines():
    pieces = [("Hello", 1), (" world", 2), ("\nnext", 1), ("ab", 3), ("\n", 2), ("z", 1)]
    assert layout(pieces, 8) == [(0, 0, "Hello", 1), (1, 0, "world", 2), (2, 0, "next", 1), (2, 4, "ab", 3),
                                 (3, 0, "z", 1)]


# ----------------------------------------------------------------------------- router histograms
def test_histogram_bars_from_hand_built_scores():
    scores = np.array([0.1, 0.2, 0.9, 0.95, 0.3])
    chosen = np.array([False, False, True, True, False])
    hist = router_output_histogram(scores, chosen, bins=2, value_range=(0.0, 1.0))
    b = histogram_bars(hist)
    assert np.allclose(b["left"], [0.0, 0.5]) and np.allclose(b["width"], [0.5, 0.5])
    assert np.allclose(b["center"], [0.25, 0.75])
    assert np.allclose(b["selected"], [0.0, 1.0]) and np.allclose(b["unselected"], [1.0, 0.0])
    assert per_recursion(json.dumps([hist, hist]))[1] == json.loads(json.dumps(hist)) and per_recursion(None) == []
    with pytest.raises(ValueError, match="3 bin edges for 1 selected"):
        histogram_bars({"bin_edges": [0, 1, 2], "selected": [1.0], "unselected": [1.0]})


# ----------------------------------------------------------------------------- sidecar files
def test_sidecar_round_trip_and_identity_check(tmp_path):
    path = tmp_path / "runs" / "g" / "rid.kv.npz"
    write_sidecar(path, {"run_id": "rid", "config_hash": "abc"}, {"key_cosine": np.eye(2)})
    meta, arrays = read_sidecar(path, run_id="rid", config_hash="abc")
    assert meta["run_id"] == "rid" and np.array_equal(arrays["key_cosine"], np.eye(2))
    assert [p.name for p in path.parent.iterdir()] == ["rid.kv.npz"]  # no temporary left, no suffix added
    with pytest.raises(ValueError, match="config_hash 'abc', not 'xyz'"):
        read_sidecar(path, config_hash="xyz")
    path.write_bytes(b"torn")
    with pytest.raises(ValueError, match="unreadable"):
        read_sidecar(path)
    with pytest.raises(FileNotFoundError, match="analysis job has not run"):
        read_sidecar(tmp_path / "missing.npz")


def test_analysis_job_resubmits_itself_and_the_launcher_knows_the_kind():
    import pickle

    from mor.launch.__main__ import main
    from mor.launch.checkpointable import Job

    job = Job("analysis", dict(analysis="kv", grid="g.yaml", run_id="r", mode="local", run_dir="runs/g/r", out="o.npz",
                               data_root="data"))
    again = job.checkpoint().function
    assert again == job and again is not job and pickle.loads(pickle.dumps(job)) == job
    with pytest.raises(SystemExit) as e:
        main(["analysis", "--analysis", "nope", "--grid", "g", "--run-id", "r", "--run-dir", "d", "--out", "o"])
    assert e.value.code == 2  # argparse: not one of depth_cap, kv
