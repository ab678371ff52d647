"""A checkpoint the authors' trainer saved, imported as one of our run folders.

    import_checkpoint(ckpt_dir, run_dir, config=None, commit="")   -> the run folder's config.json dict
    open_imported(run_dir)                                          -> our model (eval mode) with its weights
    python -m mor import-authors <checkpoint dir> <run dir> [--config their.yaml] [--commit SHA]

Their trainer (``pretrain.py`` of their release) saves the MoR Llama with ``save_pretrained``:
``config.json`` (the Llama shape, plus ``kv_sharing`` when their KV sharing was on) and
``pytorch_model.bin`` (``safe_serialization=False``: their tied layers are shared tensors, which
safetensors refuses; a ``model.safetensors`` is read too). The router settings are not in
config.json: they are the ``mor`` / ``recursive`` sections of the training config they ran
(``conf/pretrain/*.yaml``, resolved), given with ``--config`` or found in the checkpoint as
``authors_config.yaml`` or ``.hydra/config.yaml``.

Their weight names (per effective layer e, in module order):
    model.layers.{i}.<p>                      a plain layer (Middle-Cycle's first and last, or Recursive)
    model.layers.{i}.block.{j}.<p>            expert-choice: wrapper i (one per recursion), its j-th layer
    model.layers[.{i}].block_list.{r}.{j}.<p> token-choice: recursion r, its j-th layer
    model.layers[.{i}].mor_router.router.weight   expert: one per recursion (1, C); token: one (Nr, C)
    model.embed_tokens.weight, model.norm.weight, lm_head.weight (tied to the embedding)
Effective layer e becomes our unique layer ``plan.order[e]``; the MLP and norms of one unique layer
must be equal in every recursion (else the checkpoint is not the tying its config says). Attention
that differs across recursions (the release's expert-choice wrapper gives each recursion fresh
q/k/v/o) is imported as ``recursion_attention: untied``; equal attention as tied. Every tensor is
accounted for: a key left over or one our model needs and the checkpoint lacks is a
``CheckpointError`` naming it. The mapping is ours; none of their code is used.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import torch

from mor.atomic import sha256_file
from mor.checkpoint_identity import folder_files
from mor.layout import SUMMARY_FILE
from mor.checkpoints.native import CheckpointError, MODEL_FILE, load_model_weights, save_tensors

__all__ = ["import_checkpoint", "open_imported", "model_config", "map_weights", "FINAL_DIR"]

FINAL_DIR = "final"
CONFIG_NAMES = ("authors_config.yaml", ".hydra/config.yaml")
WEIGHT_NAMES = ("pytorch_model.bin", "model.safetensors")
LAYER_PARAMS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                "input_layernorm.weight", "post_attention_layernorm.weight")
ATTN = tuple(p for p in LAYER_PARAMS if p.startswith("self_attn."))
_PLAIN = re.compile(r"model\.layers\.(\d+)\.(?!block|mor_router)(.+)$")
_EXPERT = re.compile(r"model\.layers\.(\d+)\.block\.(\d+)\.(.+)$")
_TOKEN = re.compile(r"model\.layers\.(?:(\d+)\.)?block_list\.(\d+)\.(\d+)\.(.+)$")
_ROUTER = re.compile(r"model\.layers\.(?:(\d+)\.)?mor_router\.router\.weight$")


def _err(ckpt: Path, msg: str) -> CheckpointError:
    return CheckpointError(f"{ckpt}: {msg}")


def read_weights(ckpt: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    for name in WEIGHT_NAMES:
        f = ckpt / name
        if f.is_file():
            try:
                if name.endswith(".bin"):
                    return f, torch.load(f, map_location="cpu", weights_only=True)
                from safetensors.torch import load_file
                return f, load_file(str(f))
            except Exception as e:  # noqa: BLE001 - a torn file, whatever the reader raises
                raise _err(ckpt, f"{name} is unreadable ({e})") from None
    raise _err(ckpt, f"no weights ({' or '.join(WEIGHT_NAMES)}); sharded checkpoints are not supported")


def read_their_config(ckpt: Path, config: Path | None) -> dict:
    import yaml

    files = [config] if config else [ckpt / n for n in CONFIG_NAMES]
    for f in files:
        if f is not None and Path(f).is_file():
            data = yaml.safe_load(Path(f).read_text()) or {}
            return {"file": str(f), "sha256": sha256_file(f), "cfg": data}
    raise _err(ckpt, f"no training config: their router settings are not in config.json; pass --config "
                     f"<their resolved conf/pretrain yaml> or put it in the checkpoint as {CONFIG_NAMES[0]}")


def layers_of(ckpt: Path, sd: dict[str, torch.Tensor]):
    """Their keys grouped: effective layers in module order [{param: key}], routers in order, kind, Nr."""
    groups: dict[tuple, dict[str, str]] = {}
    routers: dict[int, str] = {}
    kind, recursions, wrapped = None, set(), set()
    for k in sd:
        if m := _TOKEN.match(k):
            i, r, j, p = int(m[1] or 0), int(m[2]), int(m[3]), m[4]
            groups.setdefault((i, r, j), {})[p] = k
            kind, recursions = "token_choice", recursions | {r}
            wrapped.add(i)
        elif m := _EXPERT.match(k):
            i, j, p = int(m[1]), int(m[2]), m[3]
            groups.setdefault((i, 0, j), {})[p] = k
            kind = "expert_choice"
            wrapped.add(i)
        elif m := _ROUTER.match(k):
            routers[int(m[1] or 0)] = k
        elif m := _PLAIN.match(k):
            groups.setdefault((int(m[1]), 0, 0), {})[m[2]] = k
    order = sorted(groups)
    for g in order:
        for p in groups[g]:
            if p not in LAYER_PARAMS:
                raise _err(ckpt, f"unexpected weight {groups[g][p]} (not a Llama decoder layer's)")
    nr = len(recursions) if kind == "token_choice" else len(routers) if kind == "expert_choice" else 1
    return [groups[g] for g in order], [routers[i] for i in sorted(routers)], kind, nr, order, wrapped


def tying_of(ckpt: Path, order: list[tuple], blocks: set[int]) -> str:
    """Middle-Cycle has a plain first and last layer around the recursions; Cycle has none."""
    plain = [g[0] for g in order if g[0] not in blocks]
    if not plain:
        return "cycle"
    if len(plain) == 2 and plain[0] < min(blocks) and plain[1] > max(blocks):
        return "middle_cycle"
    raise _err(ckpt, f"layer layout {order} is neither Cycle nor Middle-Cycle (their MoR builds only those)")


def model_config(ckpt: Path, hf: dict, cfg: dict, kind: str, nr: int, tying: str, untied: bool):
    """Our (ModelConfig, ScaleShape) of their checkpoint, setting by setting."""
    from mor.config import ModelConfig, RouterConfig, ScaleShape

    rec, mor = cfg.get("recursive") or {}, cfg.get("mor") or {}
    if rec.get("sharing", tying) != tying:
        raise _err(ckpt, f"config says recursive.sharing={rec.get('sharing')!r} but the weights are laid out {tying}")
    if int(rec.get("num_recursion", nr)) != nr:
        raise _err(ckpt, f"config says recursive.num_recursion={rec.get('num_recursion')} but the weights have {nr}")
    if mor.get("enable") is False:
        raise _err(ckpt, "config says mor.enable=false, but the weights have MoR routers")
    if mor.get("type") not in (None, kind.split("_")[0]):
        raise _err(ckpt, f"config says mor.type={mor.get('type')!r} but the weights are {kind}")
    if (cfg.get("relaxation") or {}).get("enable"):
        raise _err(ckpt, "relaxation.enable=true (LoRA / prompt relaxation) is not imported")
    if kind == "expert_choice" and (mor.get("expert") or {}).get("include_first", True) is not True:
        raise _err(ckpt, "mor.expert.include_first=false is not imported (our model keeps their default, true)")
    if mor.get("rand_router"):
        raise _err(ckpt, "mor.rand_router=true (a random router) has no counterpart in our model")
    if mor.get("router_type", "linear") != "linear":
        raise _err(ckpt, f"mor.router_type={mor.get('router_type')!r}: only their linear router is imported")
    sub = mor.get("expert" if kind == "expert_choice" else "token") or {}
    cap = mor.get("capacity")
    caps = tuple(float(c) for c in str(cap).split(",")) if cap not in (None, "") else \
        tuple((nr - i) / nr for i in range(nr))  # as their util/config.py fills it
    if len(caps) != nr:
        raise _err(ckpt, f"mor.capacity {cap!r} has {len(caps)} entries, not Nr={nr}")
    router: dict[str, Any] = dict(
        type=kind, func=sub.get("router_func", "sigmoid" if kind == "expert_choice" else "softmax"),
        alpha=float(sub.get("alpha", 0.1 if kind == "expert_choice" else 1.0)), temperature=float(mor.get("temp", 1.0)),
        arch="linear", gating=sub.get("gating", "weighted"),
        z_loss_coeff=float(mor.get("z_coeff", 0.0)) if mor.get("z_loss") else 0.0)
    if kind == "expert_choice":
        sampling = sub.get("sampling", "aux_loss")
        if sampling not in ("aux_loss", "aux_router"):
            raise _err(ckpt, f"mor.expert.sampling={sampling!r} has no counterpart in our model")
        router.update(capacity=caps, capacity_rounding="floor", combine="layer_output", aux=sampling,
                      aux_coeff=float(sub.get("coeff", 0.001)), capacity_warmup_steps=int(sub.get("cap_warmup_step", 0)))
    else:
        if sub.get("balancing", "loss") != "loss":
            raise _err(ckpt, f"mor.token.balancing={sub.get('balancing')!r}: only their balancing loss is imported")
        router.update(balancing="loss", balance_coeff=float(sub.get("coeff", 0.1)))
    kvs = hf.get("kv_sharing") or {}
    kv = "shared" if kvs.get("enable") else "recursion_wise"
    if kvs.get("enable") and (kvs.get("sharing") != tying or int(kvs.get("num_recursion", nr)) != nr
                              or kvs.get("update_cache")):
        raise _err(ckpt, f"kv_sharing {kvs} differs from the recursion (sharing {tying}, Nr {nr}, update_cache false)")
    if "enable" in (cfg.get("kv_sharing") or {}) and bool(cfg["kv_sharing"]["enable"]) != bool(kvs.get("enable")):
        raise _err(ckpt, f"config says kv_sharing.enable={cfg['kv_sharing']['enable']} but config.json's "
                         f"kv_sharing is {kvs or None}")
    if hf.get("rope_scaling"):
        raise _err(ckpt, f"rope_scaling {hf['rope_scaling']} is not supported")
    if not hf.get("tie_word_embeddings", True):
        raise _err(ckpt, "tie_word_embeddings=false is not supported (our lm head is the embedding)")
    if hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"]) * hf["num_attention_heads"] != hf["hidden_size"]:
        raise _err(ckpt, f"head_dim {hf['head_dim']} x heads != hidden {hf['hidden_size']}")
    shape = ScaleShape(name="authors", hidden=hf["hidden_size"], layers=hf["num_hidden_layers"],
                       heads=hf["num_attention_heads"], kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
                       mlp=hf["intermediate_size"], vocab=hf["vocab_size"],
                       max_seq_len=hf.get("max_position_embeddings", 2048), rope_theta=float(hf.get("rope_theta", 1e4)),
                       norm_eps=float(hf.get("rms_norm_eps", 1e-6)), init_std=float(hf.get("initializer_range", 0.02)))
    model = ModelConfig(scale=shape.name, variant="mor", tying=tying, num_recursions=nr,
                        router=RouterConfig(**router), kv=kv, recursion_attention="untied" if untied else "tied")
    return model, shape


def map_weights(ckpt: Path, sd: dict[str, torch.Tensor], layers: list[dict], routers: list[str], plan,
                untied: bool, kind: str) -> dict[str, torch.Tensor]:
    """Their tensors under our names; every one of theirs used (checked by the caller)."""
    from mor.model.kv_layout import recursion_of

    out: dict[str, torch.Tensor] = {}
    for name, key in (("embed_tokens.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight")):
        if key not in sd:
            raise _err(ckpt, f"missing weight {key}")
        out[name] = sd[key]
    if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"]):
        raise _err(ckpt, "lm_head.weight differs from model.embed_tokens.weight (untied embeddings are not supported)")
    if len(layers) != len(plan.order):
        raise _err(ckpt, f"{len(layers)} effective layers, the config's plan has {len(plan.order)}")
    for e, layer in enumerate(layers):
        u, r = plan.order[e], recursion_of(plan, e)
        for p in LAYER_PARAMS:
            if p not in layer:
                k0, p0 = next(iter(layer.items()))
                raise _err(ckpt, f"missing weight {p0[:-len(k0)]}{p} (effective layer {e})")
            t = sd[layer[p]]
            name = f"recursion_attn.{u}_{r}.{p.split('.', 1)[1]}" if (untied and r and p in ATTN) \
                else f"unique_layers.{u}.{p}"
            if name in out:
                if not torch.equal(out[name], t):
                    raise _err(ckpt, f"{layer[p]} differs from the same unique layer's weight in another recursion "
                                     f"(unique layer {u}: not the tying its layout says)")
            else:
                out[name] = t
    for i, key in enumerate(routers):
        out[f"routers.{i}.head.weight"] = sd[key]
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def _untied(sd, layers, plan) -> bool:
    from mor.model.kv_layout import recursion_of

    first: dict[tuple, torch.Tensor] = {}
    for e, layer in enumerate(layers):
        u = plan.order[e] if e < len(plan.order) else None
        for p in ATTN:
            if p in layer and u is not None:
                t = sd[layer[p]]
                if (u, p) in first and not torch.equal(first[u, p], t) and recursion_of(plan, e):
                    return True
                first.setdefault((u, p), t)
    return False


def import_checkpoint(ckpt: str | Path, run_dir: str | Path, config: str | Path | None = None,
                      commit: str = "", run=None) -> dict:
    """Their checkpoint folder -> our run folder (config.json, final/model.safetensors, provenance).

    ``run``: the RunConfig of a grid's run that imports this checkpoint (``model.import_checkpoint``,
    the import job): its model must be the one the checkpoint maps to (``check_agrees``), and the
    folder becomes that run (its config and config hash), so ``mor.trained.open_run`` opens it
    with the grid's config as it opens any trained run."""
    from mor.model.transformer import build_model

    ckpt, run_dir = Path(ckpt), Path(run_dir)
    hf_file = ckpt / "config.json"
    if not hf_file.is_file():
        raise _err(ckpt, "config.json missing (not a save_pretrained folder)")
    hf = json.loads(hf_file.read_text())
    theirs = read_their_config(ckpt, Path(config) if config else None)
    wfile, sd = read_weights(ckpt)
    layers, routers, kind, nr, order, wrapped = layers_of(ckpt, sd)
    if kind is None:
        raise _err(ckpt, "no MoR router in the weights (a vanilla or Recursive checkpoint; only MoR is imported)")
    tying = tying_of(ckpt, order, wrapped)
    # attention untied? decided on a tied plan's order (the untied plan has the same order)
    m0, shape = model_config(ckpt, hf, theirs["cfg"], kind, nr, tying, untied=False)
    plan = build_model(m0, shape, shape.vocab, device="meta").plan
    untied = _untied(sd, layers, plan) if len(layers) == len(plan.order) else False
    model_cfg, shape = model_config(ckpt, hf, theirs["cfg"], kind, nr, tying, untied)
    if untied and kind != "expert_choice":
        raise _err(ckpt, "attention differs across the recursions of a token-choice model (their release ties it)")
    ours = build_model(model_cfg, shape, shape.vocab, device="meta")
    tensors = map_weights(ckpt, sd, layers, routers, ours.plan, untied, kind)
    used = {k for layer in layers for k in layer.values()} | set(routers) | \
        {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    left = sorted(set(sd) - used)
    if left:
        raise _err(ckpt, f"unexpected weight {left[0]} (left over after the mapping; {len(left)} in all)")
    expected = {n for n, _ in ours.named_parameters()}
    missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing:
        raise _err(ckpt, f"missing weight for our {missing[0]} ({len(missing)} in all)")
    if extra:
        raise _err(ckpt, f"unexpected weight mapped to {extra[0]} ({len(extra)} in all)")
    for n, p in ours.named_parameters():
        if tuple(p.shape) != tuple(tensors[n].shape):
            raise _err(ckpt, f"weight for {n} has shape {tuple(tensors[n].shape)}, our model needs {tuple(p.shape)}")
    mapped = run_config(model_cfg, shape, theirs["cfg"])
    if run is not None:  # before anything is written
        check_agrees(ckpt, mapped, run)
        mapped = run
    (run_dir / FINAL_DIR).mkdir(parents=True, exist_ok=True)
    record = save_tensors(tensors, run_dir / FINAL_DIR / MODEL_FILE)
    files = folder_files(ckpt)
    meta = {"source": "authors", "model": dataclasses.asdict(model_cfg), "shape": dataclasses.asdict(shape),
            "vocab_size": shape.vocab,
            "provenance": {"checkpoint": str(ckpt.resolve()), "authors_commit": commit or theirs["cfg"].get("commit", ""),
                           "weights_file": wfile.name, "config_file": theirs["file"], "config_sha256": theirs["sha256"],
                           "files_sha256": files, "final_sha256": record["sha256"]}}
    if run is not None:
        meta["provenance"]["import_sha256"] = run.model.import_sha256
    summary = None
    if mapped is not None:  # a shape of grids/scales.yaml: a finished run that mor.trained.open_run opens
        meta["config"] = mapped.to_dict()
        summary = {"source": "authors", "run_id": mapped.run_id, "config_hash": mapped.config_hash,
                   "final_sha256": record["sha256"], "steps": int(theirs["cfg"].get("num_train_steps") or 0),
                   "tokens_seen": 0, "train_time_s": 0.0, "tokens_per_s": 0.0, "final_loss": None}
    (run_dir / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if summary is not None:  # last: the summary says the folder is a finished run
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return meta


def check_agrees(ckpt: Path, mapped, run) -> None:
    """A grid's run that imports ``ckpt`` states the model the checkpoint maps to (``mapped``, None
    when no scale of grids/scales.yaml has its shape), field by field; else a CheckpointError naming
    the first field that differs. Capacities compare as the model builds them (() = (Nr - i) / Nr)."""
    from mor.capacity import capacities

    if mapped is None:
        raise _err(ckpt, f"no scale of grids/scales.yaml has the checkpoint's shape, so run {run.run_id} "
                         f"(model.scale {run.model.scale!r}) cannot be it; import it with `python -m mor "
                         "import-authors` and open it with open_imported instead")

    def fields(m) -> dict:
        d = dataclasses.asdict(dataclasses.replace(m, import_checkpoint="", import_sha256=""))
        d["router"]["capacity"] = [round(c, 9) for c in capacities(m.num_recursions, m.router.capacity)]
        return _flat(d)

    ours, theirs = fields(run.model), fields(mapped.model)
    for key in ours:
        if ours[key] != theirs.get(key):
            raise _err(ckpt, f"run {run.run_id} says model.{key}={ours[key]!r}, but the checkpoint is "
                             f"model.{key}={theirs.get(key)!r}: set it so in the grid")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def matching_scale(shape):
    """The name of a scale in grids/scales.yaml that builds the same network as ``shape`` (its
    layer count aside: that is ``model.layers``), or None."""
    from mor.config import load_scales

    same = ("hidden", "heads", "kv_heads", "mlp", "rope_theta", "norm_eps")
    for name, sc in load_scales().items():
        if all(getattr(sc, f) == getattr(shape, f) for f in same) and sc.vocab in (0, shape.vocab) \
                and sc.max_seq_len >= shape.max_seq_len:
            return name
    return None


def run_config(model_cfg, shape, cfg: dict):
    """Our RunConfig of the imported model when a named scale has its shape (else None: only
    ``open_imported`` opens the folder)."""
    from mor.config import RunConfig, load_scales

    name = matching_scale(shape)
    if name is None:
        return None
    layers = shape.layers if shape.layers != load_scales()[name].layers else 0
    model = dataclasses.replace(model_cfg, scale=name, layers=layers)
    return RunConfig(grid="authors_import", model=model, label=f"authors {model_cfg.router.type} "
                     f"{model_cfg.tying} Nr={model_cfg.num_recursions}")


def open_imported(run_dir: str | Path, device: str | torch.device = "cpu"):
    """Our model of an imported run folder, its weights read strictly (eval mode)."""
    from mor.config import ModelConfig, ScaleShape, from_dict
    from mor.model.transformer import build_model

    run_dir = Path(run_dir)
    meta = json.loads((run_dir / "config.json").read_text())
    if meta.get("source") != "authors":
        raise CheckpointError(f"{run_dir} is not an imported checkpoint (config.json source != 'authors')")
    shape = ScaleShape(**meta["shape"])
    cfg = from_dict(ModelConfig, meta["model"], where=str(run_dir))
    model = build_model(cfg, shape, meta["vocab_size"], device=device)
    weights = run_dir / FINAL_DIR / MODEL_FILE
    if sha256_file(weights) != meta["provenance"]["final_sha256"]:
        raise CheckpointError(f"{weights}: sha256 differs from the one config.json records; import it again")
    load_model_weights(weights, model)
    return model.eval()
