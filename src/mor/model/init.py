"""Initial weights as common random numbers: each parameter from its own generator.

A parameter's initial value is drawn from a generator seeded by (the run's seed, the
parameter's *canonical name*), never from the one global stream whose position depends on
how many modules an architecture built before it. So the variants of one seed (Vanilla,
Recursive, MoR, another tying scheme) start from the same weights wherever a canonical name
and shape agree, and a paired difference between them carries less initialisation noise
(Pythia and DataDecide fix the data order for the same reason; train.seed already fixes it).

Canonical names (``canonical_names``), from the tying plan (``mor.model.tying``: effective
layer e runs unique layer ``plan.order[e]``):

    embed_tokens.weight          -> embed                (tied with the LM head)
    unique_layers.{u}.<rest>     -> layer{e}.<rest>      e = the first effective layer that runs u
                                 -> last.<rest>          u runs once, as the final effective layer
    routers.{i}.<rest>           -> router{i}.<rest>
    anything else                -> its module path

What that gives:
  * Vanilla: layer0, layer1, ..., layer{L-2}, last.
  * Middle-Cycle / Middle-Sequence: the unshared first layer is layer0 and the unshared last
    layer is ``last``, the Vanilla's first and last layers. A layer of the shared block takes
    the name of the Vanilla layer it replaces in the first recursion (Middle-Cycle with k
    layers per block: layer1..layer{k}; Cycle: layer0..layer{k-1}; Sequence: layer u*Nr).
  * MoR and its Recursive twin (same tying, Nr, scale) have the same plan, hence the same
    names and the same initial weights; MoR differs only by its routers.
  * Shapes must agree too: a name shared by two scales of different width is two draws.

The draw: z ~ N(0, 1) of the parameter's shape, scaled by ``std`` (0.02) for every matrix
(model.residual_init "normal", HF's and the authors' init), or with the residual output
projections by 1/sqrt(2 depth) (depth = effective layers; "scaled", GPT-2 / nanoGPT), so two
models of different depth still share z. Vectors (norm gains) keep their constructor values (ones).
``weight_init: global_rng`` (mor.config) keeps the draws runs made before this module.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

RESIDUAL_OUT = ("o_proj.weight", "down_proj.weight")


def canonical_names(model: nn.Module, order: list[int]) -> dict[str, str]:
    """Module parameter name -> canonical name (module docstring)."""
    first, uses = {}, {}
    for e, u in enumerate(order):
        first.setdefault(u, e)
        uses[u] = uses.get(u, 0) + 1
    last = order[-1] if order and uses[order[-1]] == 1 and first[order[-1]] == len(order) - 1 else None
    out = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        if name == "embed_tokens.weight":
            out[name] = "embed"
        elif parts[0] == "unique_layers":
            u = int(parts[1])
            out[name] = ".".join(["last" if u == last else f"layer{first[u]}"] + parts[2:])
        elif parts[0] == "routers":
            out[name] = ".".join([f"router{parts[1]}"] + parts[2:])
        else:
            out[name] = name
    return out


def residual_scale(name: str, depth: int, residual_init: str) -> float:
    """Std multiplier of parameter ``name`` in a model of ``depth`` effective layers: 1, or
    1/sqrt(2 depth) for a residual output projection under residual_init "scaled"."""
    if residual_init not in ("normal", "scaled"):
        raise ValueError(f"residual_init {residual_init!r}; choose 'normal' or 'scaled'")
    return 1 / math.sqrt(2 * depth) if residual_init == "scaled" and name.endswith(RESIDUAL_OUT) else 1.0


def generator_for(seed: int, canonical: str) -> torch.Generator:
    """A CPU generator seeded by sha256('<seed>/<canonical name>') (64 bits)."""
    key = int.from_bytes(hashlib.sha256(f"{int(seed)}/{canonical}".encode()).digest()[:8], "little")
    return torch.Generator(device="cpu").manual_seed(key)


@torch.no_grad()
def init_common(model: nn.Module, order: list[int], seed: int, std: float,
                residual_init: str = "scaled") -> dict[str, str]:
    """Draw every matrix of ``model`` from its own keyed generator (meta tensors are left
    alone: they hold no values). ``residual_init`` (model.residual_init): "scaled" divides
    the residual output projections' std by sqrt(2 depth), "normal" keeps std for every
    matrix (HF's _init_weights, the authors'). Returns the canonical names used."""
    names = canonical_names(model, order)
    for name, p in model.named_parameters():
        if p.dim() < 2 or p.is_meta:
            continue
        scale = residual_scale(name, len(order), residual_init)
        z = torch.randn(p.shape, generator=generator_for(seed, names[name]), dtype=torch.float32, device="cpu")
        p.copy_(z.mul_(std * scale).to(device=p.device, dtype=p.dtype))
    return names
