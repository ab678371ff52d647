"""Relaxed weight tying: small per-recursion parameters on top of shared layers.

Bae et al. (2024, "Relaxed Recursive Transformers") loosen layer tying by giving each
recursion a little private capacity; the MoR paper re-examines four such relaxations for
recursive KV sharing (App. H.2, Table 16). Each lives here as one ``Relaxation`` module,
stored at ``model.relax`` and reached only through three hooks of ``MoRTransformer``:
``run_layer`` (every layer call), ``layer_kv`` (a layer's keys/values alone, for KV sharing
and caches) and ``end_recursion`` (the output of a recursion block).

A *slot* is one (unique layer u, recursion r) pair that the tying plan actually runs;
every slot gets its own parameters. Unshared prefix/suffix layers (``recursion=None``)
are never relaxed. In Cycle tying a slot is exactly one effective layer. In Sequence
tying a layer repeated inside one recursion chunk (e.g. chunk 0 = layers 0,0,1) uses that
recursion's slot at each repeat: coarser than the authors' code, which gives every
effective layer its own adapter.

    lora          W x + s B_r A_r x            A_r: (rank, in), B_r: (out, rank), B_r = 0 at init
    dora          m_r * (W + s B_r A_r) x / ||W + s B_r A_r||_row     (Liu et al. 2024)
    prefix        attention also sees P learned keys/values per slot (Liu et al. 2021)
    recursion_pe  h_r <- h_r * e_r at the end of recursion r, e_r = 1 at init (Chen et al. 2025)

The tied weights are never copied: LoRA/DoRA read the shared ``nn.Linear`` output through a
forward hook and add the slot's low-rank term, so ``q_proj.weight`` of every recursion
stays the same tensor and the parameter names stay those of an unrelaxed model.

LoRA scale: s = alpha / rank with alpha = 2 * rank (the authors' config default
``alpha_pattern: 2.0``), i.e. s = 2 for every rank; the update size then does not change
with the rank (Hu et al. 2022, Sec. 4.1). No LoRA dropout (the authors use 0.1).

At init LoRA and DoRA equal the unrelaxed model exactly (B = 0, DoRA magnitude = row norms
of W), and so does recursion_pe (e_r = 1). Prefix is *not* an identity at init: the
prefix keys take part in every softmax, so they draw attention mass from the real tokens
(the authors' LLaMA-Adapter variant adds a zero-gated separate softmax instead).
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from mor.model.tying import TyingPlan

# Projections of a Block that LoRA/DoRA relax, by short name -> path inside the Block.
LORA_TARGETS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
LORA_ALPHA_PER_RANK = 2.0  # alpha = 2 * rank  ->  scale alpha / rank = 2


def relaxed_slots(plan: TyingPlan) -> list[tuple[int, int]]:
    """(unique layer, recursion) pairs run by the plan's recursions, each once, in run order."""
    seen: dict[tuple[int, int], None] = {}
    for r, rec in enumerate(plan.recursions):
        for u in rec:
            seen.setdefault((u, r), None)
    return list(seen)


def slot_name(layer_id: int, recursion: int) -> str:
    return f"layer{layer_id}_rec{recursion}"


class Relaxation(nn.Module):
    """Base: no change. Subclasses override ``run``, ``layer_kv`` and/or ``end_recursion``."""

    def run(self, layer: nn.Module, layer_id: int, recursion: int, h, positions, rope, kv=None, attn_mask=None):
        """Apply shared ``layer`` as unique layer ``layer_id`` at ``recursion``; h: (B, T, C)."""
        return layer(h, positions, rope, kv=kv, attn_mask=attn_mask)

    def layer_kv(self, layer: nn.Module, layer_id: int, recursion: int, h, positions, rope):
        """The keys/values ``layer`` computes from h at ``recursion``, (B, Hkv, T, hd) each, as
        a ``run`` call would (for KV sharing and caches; a prefix is added by ``run``, not here)."""
        return layer.project_kv(h, positions, rope)

    def end_recursion(self, recursion: int, h: torch.Tensor) -> torch.Tensor:
        """The output of recursion block ``recursion`` (B, T, C) as the next recursion sees it."""
        return h

    @torch.no_grad()
    def sync_to_base(self, layers: nn.ModuleList) -> None:
        """Re-derive parameters that depend on the tied weights (after loading a checkpoint)."""

    def _check_slot(self, layer_id: int, recursion: int, slots: dict) -> str:
        name = slot_name(layer_id, recursion)
        if name not in slots:
            raise KeyError(f"no relaxation parameters for unique layer {layer_id} at recursion {recursion}; "
                           f"the tying plan runs {sorted(slots)}")
        return name


# --------------------------------------------------------------------------------------
# LoRA / DoRA
# --------------------------------------------------------------------------------------
class LowRankDelta(nn.Module):
    """One slot's relaxation of one linear projection W: (out, in)."""

    def __init__(self, in_features: int, out_features: int, rank: int, dora: bool, weight: torch.Tensor):
        super().__init__()
        alpha = LORA_ALPHA_PER_RANK * rank
        self.rank, self.scale = rank, alpha / rank
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))  # zero: starts as the tied model
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # nn.Linear's / PEFT's default for A
        self.magnitude = nn.Parameter(torch.empty(out_features)) if dora else None
        if dora:
            self.reset_magnitude(weight)

    @torch.no_grad()
    def reset_magnitude(self, weight: torch.Tensor) -> None:
        """m = ||W + s B A|| per output row, so the DoRA layer equals W + s B A right now."""
        if self.magnitude is not None:
            self.magnitude.copy_(self.row_norm(weight))

    def row_norm(self, weight: torch.Tensor) -> torch.Tensor:
        """||W + s B A||_2 of each output row, (out,), without forming the merged matrix:

            ||w_o + s b_o A||^2 = ||w_o||^2 + 2 s (W A^T)_o . b_o + s^2 b_o (A A^T) b_o

        so backward keeps W (a parameter), W A^T (out, rank) and A A^T (rank, rank) only.
        Exact gradient (DoRA's optional detach of the norm is not used). fp32 throughout.
        """
        dev = weight.device.type
        with torch.autocast(dev, enabled=False) if dev != "meta" else contextlib.nullcontext():
            W, A, B = weight.float(), self.A.float(), self.B.float()
            wa = W @ A.T  # (out, rank)
            sq = W.pow(2).sum(1) + 2 * self.scale * (wa * B).sum(1) + self.scale**2 * ((B @ (A @ A.T)) * B).sum(1)
            return sq.clamp_min(1e-12).sqrt()  # (out,)

    def forward(self, x: torch.Tensor, base_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: (..., in) input of the linear; base_out: (..., out) = x W^T -> relaxed output."""
        delta = F.linear(F.linear(x, self.A.to(x.dtype)), self.B.to(x.dtype))  # (..., out)
        out = base_out + self.scale * delta
        if self.magnitude is None:
            return out
        gain = self.magnitude / self.row_norm(weight)  # (out,)
        return out * gain.to(out.dtype)


class LowRankRelaxation(Relaxation):
    """LoRA (``dora=False``) or DoRA deltas per slot on all seven projections of a layer.

    Hooks on the shared ``nn.Linear`` modules add the active slot's term; ``run`` sets
    which slot is active for the duration of one layer call. A shared linear called
    outside ``run_layer`` (no active slot) gives its plain tied output. Activation
    checkpointing must therefore wrap ``run_layer`` as a whole, not the bare layer.
    """

    def __init__(self, layers: nn.ModuleList, plan: TyingPlan, rank: int, dora: bool):
        super().__init__()
        self.rank, self.dora = rank, dora
        self.slots = nn.ModuleDict()
        for u, r in relaxed_slots(plan):
            deltas = nn.ModuleDict()
            for short, path in LORA_TARGETS.items():
                lin = layers[u].get_submodule(path)
                deltas[short] = LowRankDelta(lin.in_features, lin.out_features, rank, dora, lin.weight)
            self.slots[slot_name(u, r)] = deltas
        self._active: tuple[int, int] | None = None
        for u in sorted({u for u, _ in relaxed_slots(plan)}):
            for short, path in LORA_TARGETS.items():
                # a partial of a bound method: deepcopy/pickle of the model rebind it to the copy
                layers[u].get_submodule(path).register_forward_hook(functools.partial(self._hook, u, short))

    def _hook(self, layer_id: int, short: str, module: nn.Linear, inputs, output):
        if self._active is None or self._active[0] != layer_id:
            return None  # unrelaxed call: keep the tied output
        delta = self.slots[slot_name(*self._active)][short]
        return delta(inputs[0], output, module.weight)

    @contextlib.contextmanager
    def _at(self, layer_id: int, recursion: int):
        """Make slot (layer_id, recursion) the one the hooks apply, for one call."""
        self._check_slot(layer_id, recursion, self.slots)
        prev, self._active = self._active, (layer_id, recursion)
        try:
            yield
        finally:
            self._active = prev

    def run(self, layer, layer_id, recursion, h, positions, rope, kv=None, attn_mask=None):
        with self._at(layer_id, recursion):
            return layer(h, positions, rope, kv=kv, attn_mask=attn_mask)

    def layer_kv(self, layer, layer_id, recursion, h, positions, rope):
        with self._at(layer_id, recursion):  # LoRA/DoRA on k_proj, v_proj
            return layer.project_kv(h, positions, rope)

    @torch.no_grad()
    def sync_to_base(self, layers: nn.ModuleList) -> None:
        """DoRA: magnitudes back to the row norms of the (newly loaded) tied weights."""
        for name, deltas in self.slots.items():
            u = int(name.split("_")[0].removeprefix("layer"))
            for short, path in LORA_TARGETS.items():
                deltas[short].reset_magnitude(layers[u].get_submodule(path).weight)


# --------------------------------------------------------------------------------------
# Prefix (trainable key/value vectors)
# --------------------------------------------------------------------------------------
class PrefixRelaxation(Relaxation):
    """``length`` learned keys and values per slot, prepended to the attention's K/V.

    Stored per KV head, (2, H_kv, P, head_dim), so grouped-query attention shares them the
    way it shares real keys. They live in the post-RoPE key space and carry no position:
    every query may attend to all of them (the mask's prefix columns are all True), and the
    causal part of the mask is unchanged. Init N(0, std) like the other weights.
    """

    def __init__(self, plan: TyingPlan, length: int, kv_heads: int, head_dim: int, std: float):
        super().__init__()
        self.length = length
        self.slots = nn.ParameterDict()
        for u, r in relaxed_slots(plan):
            p = nn.Parameter(torch.empty(2, kv_heads, length, head_dim))  # keys, values
            nn.init.normal_(p, mean=0.0, std=std)
            self.slots[slot_name(u, r)] = p

    def run(self, layer, layer_id, recursion, h, positions, rope, kv=None, attn_mask=None):
        prefix = self.slots[self._check_slot(layer_id, recursion, self.slots)]
        B, T, _ = h.shape  # batch, tokens, channels
        if kv is None:
            kv = layer.project_kv(h, positions, rope)  # (B, Hkv, T, hd) each
        k, v = kv  # (B, Hkv, S, hd) each
        S = k.shape[2]
        if attn_mask is None:
            if S != T:
                raise ValueError(f"attention over {S} keys for {T} queries needs an explicit attn_mask")
            attn_mask = torch.ones(T, T, dtype=torch.bool, device=h.device).tril().expand(B, 1, T, T)
        pk, pv = prefix.to(k.dtype).unsqueeze(1).expand(-1, B, -1, -1, -1)  # (B, Hkv, P, hd) each
        k = torch.cat([pk, k], dim=2)  # (B, Hkv, P+S, hd)
        v = torch.cat([pv, v], dim=2)  # (B, Hkv, P+S, hd)
        shape = (*attn_mask.shape[:-1], self.length)
        # bool mask: True = may attend; float (additive) mask: 0 = may attend
        see_prefix = attn_mask.new_ones(shape) if attn_mask.dtype == torch.bool else attn_mask.new_zeros(shape)
        mask = torch.cat([see_prefix, attn_mask], dim=-1)  # (B|1, 1, T, P+S)
        return layer(h, positions, rope, kv=(k, v), attn_mask=mask)


# --------------------------------------------------------------------------------------
# Recursion position encoding
# --------------------------------------------------------------------------------------
class RecursionPE(Relaxation):
    """A learned gain e_r (C,) per recursion, multiplied into the output of recursion r.

    Vectors (not one (Nr, C) matrix) so the optimizer's no-decay group keeps them: weight
    decay would pull the ones-initialised gains toward zero.
    """

    def __init__(self, num_recursions: int, hidden: int):
        super().__init__()
        self.gains = nn.ParameterList(nn.Parameter(torch.ones(hidden)) for _ in range(num_recursions))

    def end_recursion(self, recursion: int, h: torch.Tensor) -> torch.Tensor:
        return h * self.gains[recursion].to(h.dtype)  # (B, T, C)


def build_relaxation(model: nn.Module) -> Relaxation | None:
    """The relaxation of ``model.cfg`` for a constructed (and initialised) model, or None."""
    cfg, shape, plan = model.cfg, model.shape, model.plan
    kind = cfg.relaxation
    if kind == "none":
        return None
    if cfg.variant == "vanilla":
        raise ValueError(f"model.relaxation={kind!r} needs a recursive or MoR model")
    if kind in ("lora", "dora"):
        return LowRankRelaxation(model.unique_layers, plan, cfg.relaxation_rank, dora=kind == "dora")
    if kind == "prefix":
        return PrefixRelaxation(plan, cfg.relaxation_rank, shape.kv_heads, shape.head_dim, shape.init_std)
    if kind == "recursion_pe":
        return RecursionPE(len(plan.recursions), shape.hidden)
    raise ValueError(f"unknown relaxation {kind!r}")
