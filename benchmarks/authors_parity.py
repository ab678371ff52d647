"""Numbers from the authors' model code, for tests/unit/test_authors_parity.py.

    PYTHONPATH=src .venv/bin/python benchmarks/authors_parity.py \
        --authors /tmp/authors-aef56f7 --python /tmp/authors-venv/bin/python

builds OUR model for each tiny case below (seeded: the unit test rebuilds the same weights),
copies its weights into THEIR model (effective layer e <- our unique layer plan.order[e]),
runs their training-mode forward in float32 on CPU in a separate process (their venv: torch
and transformers 4.52.4, which ours does not have; nothing of theirs is imported here), and
writes their logits, routing masks and router losses to tests/fixtures/authors_parity.npz with
the case specs (JSON). Their code is not copied into this project: the fixture holds numbers.

The authors' checkout: their public repository at the release (a fork such as
williamkuo2000/mixture_of_recursions at aef56f7). Their release's expert-choice wrapper gives
each effective layer a fresh attention module (q/k/v/o untied across recursions, fixed in a
later commit that ties them); the weights copied here are the same in every recursion unless
a case asks for ``recursion_attention: untied``, so the forward does not depend on that.

T is 32 (not 36) so that floor and ceil capacities differ (21 / 10 vs 22 / 11 at Nr 3); the
routers' weights are multiplied by ``router_scale`` so that the top-k margins are far above
float noise (routing is decisive) without saturating the sigmoid (their top-k ranks
alpha * sigmoid(logit), ours the logit: equal orders unless the sigmoid rounds to 1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "authors_parity.npz"

SHAPE = dict(name="parity", hidden=64, layers=8, heads=4, kv_heads=2, mlp=128, vocab=128, max_seq_len=64)
BATCH, SEQ, SEED, ROUTER_SCALE = 2, 32, 0, 8.0
EXPERT = dict(type="expert_choice", func="sigmoid", alpha=0.1, aux="aux_loss")
TOKEN = dict(type="token_choice", func="softmax", alpha=1.0, balancing="loss", balance_coeff=0.1, z_loss_coeff=1e-5)
# name -> our model config (mor.config.ModelConfig as a dict; the scale is SHAPE)
CASES = {
    "token_mc3": dict(variant="mor", tying="middle_cycle", num_recursions=3, router=TOKEN),
    "token_mc3_kv": dict(variant="mor", tying="middle_cycle", num_recursions=3, router=TOKEN, kv="shared"),
    "expert_mc3": dict(variant="mor", tying="middle_cycle", num_recursions=3, router=EXPERT),
    "expert_cycle2_zloss": dict(variant="mor", tying="cycle", num_recursions=2, layers=4,
                                router=dict(EXPERT, z_loss_coeff=1e-3)),
    "expert_mc3_kv": dict(variant="mor", tying="middle_cycle", num_recursions=3, router=EXPERT, kv="shared"),
    "expert_mc3_untied": dict(  # the release's untied attention, our recursion_attention "untied"
        variant="mor", tying="middle_cycle", num_recursions=3, router=EXPERT, recursion_attention="untied"),
}


# ----------------------------------------------------------------------------- our side
def build_ours(spec: dict):
    """Our model of one case spec (the fixture's JSON): seeded weights, routers scaled."""
    import torch

    from mor.config import ModelConfig, ScaleShape, from_dict
    from mor.model.transformer import build_model

    shape = ScaleShape(**spec["shape"])
    cfg = from_dict(ModelConfig, dict(spec["model"], scale=shape.name), where=spec["name"])
    model = build_model(cfg, shape, shape.vocab, init_seed=spec["seed"])
    with torch.no_grad():
        for router in model.routers:
            router.head.weight.mul_(spec["router_scale"])  # (out, C): decisive routing
    return model.train()  # training forward: top-k routing and the router losses


def our_weights(model) -> dict:
    """Their parameter layout (per effective layer) filled from ours, as numpy arrays."""
    from mor.model.kv_layout import recursion_of

    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    out = {"embed": sd["embed_tokens.weight"], "norm": sd["norm.weight"], "layers": []}
    for e, u in enumerate(model.plan.order):
        layer = {k.split(f"unique_layers.{u}.", 1)[1]: v for k, v in sd.items() if k.startswith(f"unique_layers.{u}.")}
        r = recursion_of(model.plan, e)
        if r and model.recursion_attn:  # untied attention: recursion r > 1 (0-based r >= 1) runs its own q/k/v/o
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                layer[f"self_attn.{proj}.weight"] = sd[f"recursion_attn.{u}_{r}.{proj}.weight"]
        out["layers"].append(layer)
    out["routers"] = [sd[f"routers.{i}.head.weight"] for i in range(len(model.routers))]
    return out


# ----------------------------------------------------------------------------- their side
WORKER = r'''
import json, sys
import numpy as np, torch
from omegaconf import OmegaConf
sys.path.insert(0, sys.argv[1])
from transformers import LlamaConfig
from model.mor_model.modeling_llama import MoRLlamaForCausalLM
from model.sharing_strategy.llama import sharing_strategy

from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def cpu_flash(module, q, k, v, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """flash_attention_2's contract on CPU, as their runs used it: causal (bottom-right aligned),
    a 2-D padding mask ignored (right padding: no valid query sees a pad under the causal
    mask), output (B, T, H, hd). Their token-choice path needs it: its 4-D mask code fails
    for batches > 1, and SDPA / eager get its 2-D padding mask."""
    Tq, Tk = q.shape[2], k.shape[2]
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)  # (Tq, Tk)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling,
                                                         enable_gqa=k.shape[1] != q.shape[1])  # (B, H, Tq, hd)
    return y.transpose(1, 2).contiguous(), None  # (B, Tq, H, hd)


ALL_ATTENTION_FUNCTIONS["flash_attention_2"] = cpu_flash
job = json.load(open(sys.argv[2]))
data = np.load(sys.argv[3], allow_pickle=True)
torch.manual_seed(0)
results = {}
for case in job["cases"]:
    name, s, m = case["name"], case["shape"], case["model"]
    w = data[name].item()
    nr, router = m["num_recursions"], m["router"]
    L = len(w["layers"])
    conf = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["mlp"],
                       num_hidden_layers=L, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                       max_position_embeddings=s["max_seq_len"], rms_norm_eps=1e-5, rope_theta=10000.0,
                       tie_word_embeddings=True, initializer_range=0.02, attn_implementation="eager",  # switched to flash below
                       torch_dtype="float32")
    expert = router["type"] == "expert_choice"
    kv = m.get("kv", "recursion_wise") == "shared"
    cfg = OmegaConf.create({
        "precision": "fp32", "num_warmup_steps": 0, "gradient_accumulation_steps": 1,
        "recursive": {"sharing": m["tying"], "num_recursion": nr, "ln_share": True, "initialization": "random"},
        "mor": {"rand_router": False, "router_type": "linear", "temp": 1.0, "capacity": None,
                "z_loss": bool(router.get("z_loss_coeff", 0.0)), "z_coeff": router.get("z_loss_coeff", 0.0),
                "expert": {"router_func": "sigmoid", "alpha": router.get("alpha", 0.1), "sampling": "aux_loss",
                           "gating": "weighted", "cap_warmup_step": 0},
                "token": {"router_func": router.get("func", "softmax"), "alpha": router.get("alpha", 1.0),
                          "balancing": "loss", "gating": "weighted", "bal_warmup_step": 0}},
        **({"kv_sharing": {"enable": True, "sharing": m["tying"], "num_recursion": nr, "update_cache": False}}
           if kv else {}),
    })
    cfg.mor.capacity = ",".join(str((nr - i) / nr) for i in range(nr))  # as their util/config.py fills it
    model = MoRLlamaForCausalLM(conf)
    model.config._attn_implementation = "flash_attention_2"  # their runs' setting; cpu_flash above
    model, _ = sharing_strategy(cfg, model)
    eff = list(model.model.layers)  # effective layers, weights tied across recursions
    (model.transform_layer_to_mor_expert if expert else model.transform_layer_to_mor_token)(cfg)
    if kv:
        model.set_kv_sharing_config(cfg)
    wrappers = [l for l in model.model.layers if getattr(l, "mor", False)]
    with torch.no_grad():
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
        model.model.embed_tokens.weight.copy_(t(w["embed"]))
        model.lm_head.weight = model.model.embed_tokens.weight
        model.model.norm.weight.copy_(t(w["norm"]))
        for e, layer in enumerate(eff):  # after the wrappers: their fresh attention modules too
            for k, v in w["layers"][e].items():
                layer.get_parameter(k).copy_(t(v))
        for i, rw in enumerate(w["routers"]):
            wrappers[i].mor_router.router.weight.copy_(t(rw))
    # routing masks: expert-choice selected_tokens per recursion; token-choice the depth chosen
    picked = []
    if expert:
        for wr in wrappers:
            wr.register_forward_hook(lambda mod, a, kw, out: picked.append(out.selected_tokens.squeeze(-1)),
                                     with_kwargs=True)
    else:
        wrappers[0].mor_router.register_forward_hook(lambda mod, a, out: picked.append(out))
    model.train()
    ids = t(case["input_ids"]).long()
    B, T = ids.shape
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=kv, num_items_in_batch=B * T)
    res = {"logits": out.logits.float().numpy(),
           "sampling_loss": float(out.sampling_loss), "router_z_loss": float(out.router_z_loss),
           "balancing_loss": float(out.balancing_loss)}
    if expert:
        masks = np.zeros((nr, B, T), dtype=bool)
        for r, idx in enumerate(picked):
            for b in range(B):
                masks[r, b, idx[b].numpy()] = True
        res["selected"] = masks
    else:
        logits = picked[0]  # (B, T, Nr) their router's logits on their states
        probs = torch.softmax(logits, dim=-1) * router.get("alpha", 1.0)
        res["depth_id"] = torch.topk(probs, 1, dim=-1).indices.squeeze(-1).numpy()  # (B, T) depth - 1
    results[name] = res
np.save(sys.argv[4], results, allow_pickle=True)
'''


def run_authors(authors: Path, python: str, specs: list[dict], weights: dict) -> dict:
    """Their forward for every case, in their venv (a separate process)."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "worker.py").write_text(WORKER)
        (tmp / "job.json").write_text(json.dumps({"cases": specs}))
        np.savez(tmp / "weights.npz", **{k: np.array(v, dtype=object) for k, v in weights.items()})
        subprocess.run([python, str(tmp / "worker.py"), str(authors), str(tmp / "job.json"), str(tmp / "weights.npz"),
                        str(tmp / "out.npy")], check=True, cwd=tmp)
        return np.load(tmp / "out.npy", allow_pickle=True).item()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--authors", type=Path, required=True, help="checkout of the authors' repository (release tree)")
    ap.add_argument("--python", default="/tmp/authors-venv/bin/python",
                    help="python of a venv with their pins (torch, transformers 4.52.4, omegaconf, numpy)")
    ap.add_argument("--out", type=Path, default=FIXTURE)
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    specs, weights = [], {}
    gen = torch.Generator().manual_seed(SEED)
    for name in args.cases:
        ids = torch.randint(0, SHAPE["vocab"], (BATCH, SEQ), generator=gen).numpy()
        spec = dict(name=name, shape=SHAPE, model=CASES[name], seed=SEED, router_scale=ROUTER_SCALE,
                    input_ids=ids.tolist())
        specs.append(spec)
        weights[name] = our_weights(build_ours(spec))
    theirs = run_authors(args.authors, args.python, specs, weights)
    arrays = {"specs": np.array(json.dumps(specs))}
    for name, res in theirs.items():
        for key, value in res.items():
            arrays[f"{name}/{key}"] = np.asarray(value)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes): {', '.join(theirs)}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    main()
