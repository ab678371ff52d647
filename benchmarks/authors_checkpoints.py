"""Checkpoints written by the authors' own code, for tests/unit/test_authors_import.py.

    /tmp/authors-venv/bin/python benchmarks/authors_checkpoints.py --authors /tmp/authors-aef56f7

Run with THEIR venv's python (torch, transformers 4.52.4, omegaconf; nothing of ours is imported).
For each tiny case it builds their MoR Llama as their pretrain.py does (LlamaConfig ->
sharing_strategy -> transform_layer_to_mor_{expert,token} -> set_kv_sharing_config), with their
own N(0, 0.02) initialisation (seeded) and the routers scaled so that routing is decisive, saves it
with ``save_pretrained(safe_serialization=False)`` (their tied layers are shared tensors, which
safetensors refuses) into tests/fixtures/authors_ckpt/<case>/, writes the training config's
``recursive`` / ``mor`` / ``kv_sharing`` sections as authors_config.yaml (what --config gives the
importer), and expected.npz: the input ids, their training forward's logits (float32, CPU) and
routing (expert: selected masks per recursion; token: depth - 1 per token). Their code is not
copied into the project: the fixtures hold their numbers and their saved weights.

``attention: tied`` copies recursion 1's q/k/v/o into the later recursions' fresh modules of the
release's expert-choice wrapper (the later commit 82c97f's tied attention); ``untied`` keeps the
release's separate ones.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "authors_ckpt"
SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.02)
# (the shape of our `tiny` scale, grids/scales.yaml, with their layer count: the importer then writes
# a full run folder that mor.trained.open_run, and so eval / lmeval / the engine, open)
BATCH, SEQ, SEED, ROUTER_SCALE = 2, 16, 0, 30.0
CASES = {  # name -> (router, sharing, Nr, layers, kv sharing, attention)
    "expert_mc3_untied": ("expert", "middle_cycle", 3, 5, False, "untied"),
    "expert_mc3_kv_tied": ("expert", "middle_cycle", 3, 5, True, "tied"),
    "expert_cycle2_untied": ("expert", "cycle", 2, 4, False, "untied"),
    "token_mc3_kv": ("token", "middle_cycle", 3, 5, True, "tied"),
    "token_mc3": ("token", "middle_cycle", 3, 5, False, "tied"),
    # the engine's model (tied attention) with the vocabulary of a local BPE (bpe-512), so eval, lmeval and
    # the throughput job read real tokens through it (grids/authors/imported.yaml; issue 62)
    "expert_mc3_tied_v512": ("expert", "middle_cycle", 3, 5, False, "tied"),
}
VOCAB = {"expert_mc3_tied_v512": 512}  # case -> vocab_size where it is not SHAPE's
# Not here: token-choice with Cycle sharing. Their transform_layer_to_mor_token then puts the
# wrapper in place of model.layers and their forward fails ('MoRLlamaDecoderLayer' object is not
# subscriptable), so their code has no such model to save.


def cpu_flash(module, q, k, v, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """flash_attention_2's contract on CPU (causal, bottom-right aligned; as authors_parity.py)."""
    import torch

    Tq, Tk = q.shape[2], k.shape[2]
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling,
                                                         enable_gqa=k.shape[1] != q.shape[1])
    return y.transpose(1, 2).contiguous(), None


def their_cfg(router, sharing, nr, kv):
    return {
        "commit": "aef56f7",
        "recursive": {"enable": True, "sharing": sharing, "num_recursion": nr, "ln_share": True,
                      "initialization": "random"},
        "mor": {"enable": True, "type": router, "rand_router": False, "router_type": "linear", "temp": 1.0,
                "capacity": ",".join(str((nr - i) / nr) for i in range(nr)), "z_loss": router == "token",
                "z_coeff": 1e-5 if router == "token" else 0.0,
                "expert": {"router_func": "sigmoid", "alpha": 0.1, "sampling": "aux_loss", "coeff": 0.001,
                           "gating": "weighted", "cap_warmup_step": 0},
                "token": {"router_func": "softmax", "alpha": 1.0, "balancing": "loss", "coeff": 0.1,
                          "gating": "weighted", "bal_warmup_step": 0}},
        **({"kv_sharing": {"enable": True, "sharing": sharing, "num_recursion": nr, "update_cache": False}}
           if kv else {}),
    }


def build_case(name, spec, out: Path):
    import numpy as np
    import torch
    import yaml
    from omegaconf import OmegaConf
    from transformers import LlamaConfig
    from model.mor_model.modeling_llama import MoRLlamaForCausalLM
    from model.sharing_strategy.llama import sharing_strategy

    router, sharing, nr, layers, kv, attention = spec
    raw = their_cfg(router, sharing, nr, kv)
    cfg = OmegaConf.create(dict(raw, precision="fp32", num_warmup_steps=0, gradient_accumulation_steps=1))
    torch.manual_seed(SEED)
    shape = dict(SHAPE, vocab_size=VOCAB.get(name, SHAPE["vocab_size"]))
    conf = LlamaConfig(num_hidden_layers=layers, **shape)
    model = MoRLlamaForCausalLM(conf)
    model.config._attn_implementation = "flash_attention_2"
    model, _ = sharing_strategy(cfg, model)
    (model.transform_layer_to_mor_expert if router == "expert" else model.transform_layer_to_mor_token)(cfg)
    if kv:
        model.set_kv_sharing_config(cfg)
    wrappers = [m for m in model.modules() if hasattr(m, "mor_router")]  # module order
    with torch.no_grad():
        for w in wrappers:
            w.mor_router.router.weight.mul_(ROUTER_SCALE)
        if router == "expert" and attention == "tied":
            first = wrappers[0].block
            for w in wrappers[1:]:
                for j, layer in enumerate(w.block):
                    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                        getattr(layer.self_attn, p).weight.copy_(getattr(first[j].self_attn, p).weight)
    picked = []
    if router == "expert":
        for w in wrappers:
            w.register_forward_hook(lambda mod, a, kw, o: picked.append(o.selected_tokens.squeeze(-1)), with_kwargs=True)
    else:
        wrappers[0].mor_router.register_forward_hook(lambda mod, a, o: picked.append(o))
    model.train()
    ids = torch.randint(0, shape["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        res = model(input_ids=ids, use_cache=kv, num_items_in_batch=BATCH * SEQ)
    arrays = {"input_ids": ids.numpy(), "logits": res.logits.float().numpy()}
    if router == "expert":
        masks = np.zeros((nr, BATCH, SEQ), dtype=bool)
        for r, idx in enumerate(picked):
            for b in range(BATCH):
                masks[r, b, idx[b].numpy()] = True
        arrays["selected"] = masks
    else:
        probs = torch.softmax(picked[0], dim=-1)
        arrays["depth_id"] = torch.topk(probs, 1, dim=-1).indices.squeeze(-1).numpy()
    d = out / name
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=False)
    (d / "generation_config.json").unlink(missing_ok=True)
    (d / "authors_config.yaml").write_text(yaml.safe_dump(raw, sort_keys=True))
    np.savez_compressed(d / "expected.npz", **arrays)
    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"{name}: {size} bytes")
    return size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--authors", type=Path, required=True, help="checkout of their release tree (aef56f7)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.authors))
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS["flash_attention_2"] = cpu_flash
    total = sum(build_case(n, CASES[n], args.out) for n in args.cases)
    listed = args.out / "cases.json"  # the cases built now, added to those already there
    cases = json.loads(listed.read_text()) if listed.is_file() else {}
    cases.update({n: CASES[n] for n in args.cases})
    listed.write_text(json.dumps(cases, indent=1) + "\n")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
