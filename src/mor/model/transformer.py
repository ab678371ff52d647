"""The model family in one class: Vanilla, Recursive (four tying schemes) and MoR.

    embed -> prefix layers -> recursion 1 .. Nr (a chunk of shared layers each) -> suffix
          -> norm -> lm_head (tied to embed)

Vanilla is the degenerate case of one recursion holding every layer once. Recursive models
run every token through every recursion. MoR models pass a router decision between
recursions: expert-choice keeps the top-k active tokens of each sequence at each recursion
and runs the recursion on that gathered subsequence only (so attention sees, and a cache
would store, only the tokens routed to it: recursion-wise caching).

Tied layers are the same ``nn.Module`` objects reused across recursions, so their weights
are the same tensors; ``unique_layers`` holds each exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from mor.config import ModelConfig, ScaleShape
from mor.model.init import init_common
from mor.model.layers import Attention, Block, RMSNorm, RotaryEmbedding, init_weights
from mor.model.relax import build_relaxation
from mor.model.routers.registry import router_kind
from mor.model.tying import kv_producers, kv_unused, model_plan
from mor.model.kv_sharing import run_kv_layer


@dataclass
class RoutingTrace:
    """What the router did in one forward pass (detached), for metrics and figures."""

    selected: list[torch.Tensor] = field(default_factory=list)  # per recursion: (B, T) bool
    scores: list[torch.Tensor] = field(default_factory=list)  # per recursion: (B, T) router weight g
    causal_keep: list[torch.Tensor] = field(default_factory=list)  # per recursion: (B, T) bool
    candidates: list[torch.Tensor] = field(default_factory=list)  # per recursion: (B, T) bool
    probs: torch.Tensor | None = None  # token-choice: (B, T, Nr) selection probabilities
    assignment: torch.Tensor | None = None  # token-choice: (B, T) long expert id = depth - 1

    def depths(self) -> torch.Tensor | None:
        """(B, T) number of recursions each token received (1..Nr)."""
        if not self.selected:
            return None
        return torch.stack(self.selected).sum(0)


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # (B, T, V); None when lm_loss_fn gave the loss (mor.train.execution)
    loss: torch.Tensor | None = None  # LM loss + weighted router losses
    lm_loss: torch.Tensor | None = None  # mean next-token cross-entropy
    aux_loss: torch.Tensor | None = None  # weighted router losses alone
    routing: RoutingTrace | None = None


class MoRTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig, shape: ScaleShape, vocab_size: int, init_seed: int | None = None):
        """``init_seed``: the seed of the initial weights (mor.model.init); None = the seed last
        given to ``torch.manual_seed`` (the trainer sets train.seed just before building)."""
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.cfg, self.shape, self.vocab_size = cfg, shape, vocab_size
        self.plan = model_plan(cfg, shape.layers)  # model.layers overrides the scale's depth
        C = shape.hidden
        self.embed_tokens = nn.Embedding(vocab_size, C)
        self.unique_layers = nn.ModuleList(
            Block(C, shape.heads, shape.kv_heads, shape.mlp, shape.norm_eps)  # backend: mor.train.execution
            for _ in range(self.plan.num_unique)
        )
        self.norm = RMSNorm(C, shape.norm_eps)
        # model.recursion_attention 'untied' (the authors' release): recursion r > 1 of unique
        # layer u attends with its own q/k/v/o, "u_r"; recursion 1 keeps the layer's own.
        # Its MLP and norms stay tied. Cycle tying puts each (u, r) in one effective layer.
        self.recursion_attn = nn.ModuleDict()
        if cfg.recursion_attention == "untied":
            for r, rec in enumerate(self.plan.recursions[1:], start=1):
                for u in rec:
                    self.recursion_attn[f"{u}_{r}"] = Attention(C, shape.heads, shape.kv_heads)
        self.rope = RotaryEmbedding(shape.head_dim, shape.max_seq_len, shape.rope_theta)
        # the router kind (mor.model.routers): builds the routers, runs the routed stack in
        # training, decides depths before recursion 1 at inference; None without routers
        self.router_kind = router_kind(cfg.router.type) if cfg.variant == "mor" else None
        self.routers = nn.ModuleList()
        if self.router_kind is not None:
            self.routers.extend(self.router_kind.build_routers(C, cfg.num_recursions, cfg.router))
        self.capacity_scale = 1.0  # < 1 during capacity warm-up; set by the trainer
        # how training computes, set from outside (mor.train.execution), used in training mode only:
        # each layer call as layer_wrapper(call, *args); the LM loss as lm_loss_fn(normed h, head, targets)
        self.layer_wrapper = None
        self.lm_loss_fn = None
        # effective layer -> effective layer whose keys/values it attends over (model.kv)
        self.kv_producers = kv_producers(self.plan, cfg.kv, cfg.variant, cfg.tying, cfg.num_recursions)
        self.kv_sources = frozenset(p for e, p in enumerate(self.kv_producers) if p != e)
        if cfg.weight_init == "crn":  # common random numbers across the variants of one seed
            init_common(self, self.plan.order, torch.initial_seed() if init_seed is None else init_seed, shape.init_std,
                        cfg.residual_init)
        else:
            init_weights(self, shape.init_std, len(self.plan.order), cfg.residual_init)
        self.relax = build_relaxation(self)  # after init_weights: LoRA B stays 0, PE gains 1

    # ------------------------------------------------------------------ structure
    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight  # tied embeddings

    def layers_at(self, ids: tuple[int, ...]) -> list[Block]:
        return [self.unique_layers[i] for i in ids]

    def run_layer(self, layer_id: int, h, positions, recursion: int | None, kv=None, attn_mask=None):
        """Apply unique layer ``layer_id`` at recursion ``recursion`` (None = unshared layer).

        The single place a layer is called, so per-recursion relaxations (LoRA, recursion
        position encodings) and KV strategies hook in here. h: (B, T, C); positions: (B, T).
        In training mode the whole call (relaxation included) runs through ``layer_wrapper``
        where one is set (activation checkpointing: mor.train.execution).
        """
        if self.layer_wrapper is not None and self.training:
            return self.layer_wrapper(self._run_layer, layer_id, h, positions, recursion, kv, attn_mask)
        return self._run_layer(layer_id, h, positions, recursion, kv, attn_mask)

    def attention_at(self, layer_id: int, recursion: int | None) -> Attention | None:
        """The attention unique layer ``layer_id`` runs at ``recursion`` when it is not the
        layer's own (untied attention, recursion > 1); None otherwise."""
        if not self.recursion_attn or not recursion:
            return None
        return self.recursion_attn[f"{layer_id}_{recursion}"]

    def _run_layer(self, layer_id: int, h, positions, recursion: int | None, kv=None, attn_mask=None):
        layer = self.unique_layers[layer_id]
        if self.relax is not None and recursion is not None:
            return self.relax.run(layer, layer_id, recursion, h, positions, self.rope, kv=kv, attn_mask=attn_mask)
        return layer(h, positions, self.rope, kv=kv, attn_mask=attn_mask, attn=self.attention_at(layer_id, recursion))

    def layer_kv(self, layer_id: int, h, positions, recursion: int | None):
        """Keys/values unique layer ``layer_id`` computes from h at ``recursion``: (B, Hkv, T, hd)
        each, keys rotated. Runs inside the relaxation's context like ``run_layer`` (LoRA on
        k_proj/v_proj applies), so KV sharing and the decode cache see the KV a layer call would.
        """
        layer = self.unique_layers[layer_id]
        if self.relax is not None and recursion is not None:
            return self.relax.layer_kv(layer, layer_id, recursion, h, positions, self.rope)
        return layer.project_kv(h, positions, self.rope, attn=self.attention_at(layer_id, recursion))

    def end_recursion(self, recursion: int, h: torch.Tensor) -> torch.Tensor:
        """Output of recursion block ``recursion`` (B, T, C) -> what follows it (recursion PE hook).

        Every recursion loop calls it once after the block's last layer, before any gating.
        """
        return h if self.relax is None else self.relax.end_recursion(recursion, h)

    def after_optimizer_step(self) -> None:
        """Non-gradient state updates after ``optimizer.step()`` (loss-free balancing bias)."""
        for router in self.routers:
            if hasattr(router, "after_optimizer_step"):
                router.after_optimizer_step()

    def head(self, h: torch.Tensor, logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm + tied lm_head on h (B, T, C), or on its positions ``logits_at`` (B, n)."""
        if logits_at is not None:
            h = h.gather(1, logits_at.unsqueeze(-1).expand(-1, -1, h.shape[-1]))  # (B, n, C)
        return F.linear(self.norm(h), self.lm_head_weight)

    def unused_parameter_names(self) -> frozenset[str]:
        """Parameters built but never run: the K/V projections (and their relaxation deltas)
        of layers that only read shared KV (``mor.model.tying.kv_unused``). They receive no
        gradient and are left out of ``num_params``; kept in the module so checkpoints of
        every existing run still load."""
        layers, slots = kv_unused(self.plan, self.kv_producers, self.cfg.kv)
        names = {f"unique_layers.{u}.self_attn.{proj}.weight" for u in layers for proj in ("k_proj", "v_proj")}
        if self.cfg.kv == "shared":  # untied attention of recursions > 1 reads recursion 1's KV
            names |= {f"recursion_attn.{key}.{proj}.weight" for key in self.recursion_attn for proj in ("k_proj", "v_proj")}
        if slots and self.relax is not None and hasattr(self.relax, "slots"):
            for pname, _ in self.relax.named_parameters(prefix="relax"):
                parts = pname.split(".")  # relax.slots.layer{u}_rec{r}.{k,v}_proj.<A|B|magnitude>
                if len(parts) == 5 and parts[3] in ("k_proj", "v_proj"):
                    u, r = parts[2].removeprefix("layer").split("_rec")
                    if (int(u), int(r)) in slots:
                        names.add(pname)
        return frozenset(names)

    def num_params(self) -> int:
        """Unique parameters the model runs (tied tensors counted once, as the paper counts;
        unused K/V projections of shared-KV layers left out, see ``unused_parameter_names``)."""
        unused = self.unused_parameter_names()
        return sum(p.numel() for n, p in self.named_parameters() if n not in unused)

    # ------------------------------------------------------------------ forward
    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                logits_at: torch.Tensor | None = None, max_depth: int | None = None) -> ModelOutput:
        """idx: (B, T) token ids; targets: (B, T) next-token ids (-100 = ignore).

        ``logits_at`` (B, n) positions: the logits are computed there only, (B, n, V) (scoring
        a few positions of each input skips the vocabulary projection of the others).
        ``max_depth`` (1..Nr) caps the recursion depth at inference (test-time scaling, § 5.3):
        recursions past it are skipped for every token, the routing of the recursions that
        run is unchanged, and the unshared suffix layers and the head follow as usual."""
        if logits_at is not None and targets is not None:
            raise ValueError("logits_at is for scoring without targets")
        B, T = idx.shape  # batch, tokens
        depth = check_max_depth(max_depth, len(self.plan.recursions))
        if T > self.shape.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.shape.max_seq_len}")
        positions = torch.arange(T, device=idx.device).expand(B, T)  # (B, T)
        h = self.embed_tokens(idx)  # (B, T, C)
        for layer_id in self.plan.prefix:
            h = self.run_layer(layer_id, h, positions, recursion=None)
        routing = RoutingTrace() if self.routers else None
        aux = h.new_zeros((), dtype=torch.float32)
        if self.routers:
            h, aux = self.router_kind.run(self, h, positions, routing, max_depth=depth)
        else:
            kv_store: dict = {}  # producer layer -> its (k, v, positions), for KV sharing
            e = len(self.plan.prefix)  # effective index of the next layer
            for r, rec in enumerate(self.plan.recursions[:depth]):
                for layer_id in rec:
                    h = run_kv_layer(self, e, layer_id, h, positions, r, kv_store)
                    e += 1
                h = self.end_recursion(r, h)
        for layer_id in self.plan.suffix:
            h = self.run_layer(layer_id, h, positions, recursion=None)
        if targets is not None and self.lm_loss_fn is not None and self.training:
            out = ModelOutput(logits=None, routing=routing)  # no (B, T, V) logits: the hook works from h
            out.lm_loss = self.lm_loss_fn(self.norm(h).view(B * T, -1), self.lm_head_weight, targets.reshape(-1))
        else:
            logits = self.head(h, logits_at)  # (B, T or n, V)
            out = ModelOutput(logits=logits, routing=routing)
        if targets is not None and out.lm_loss is None:
            out.lm_loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(-1), ignore_index=-100)
        if targets is not None:
            out.aux_loss = aux
            out.loss = out.lm_loss + aux
        return out


def check_max_depth(max_depth: int | None, num_recursions: int) -> int:
    """The number of recursions to run: ``max_depth`` (1..Nr), or Nr when it is None."""
    if max_depth is None:
        return num_recursions
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 1 <= max_depth <= num_recursions:
        raise ValueError(f"max_depth must be an integer in 1..{num_recursions} (the model's recursions), got {max_depth!r}")
    return max_depth


def build_model(cfg: ModelConfig, shape: ScaleShape, vocab_size: int, device: str | torch.device = "cpu",
                init_seed: int | None = None):
    """Construct on ``device`` ('meta' allocates nothing: used to count real-size params)."""
    with torch.device(device):
        return MoRTransformer(cfg, shape, vocab_size, init_seed)
