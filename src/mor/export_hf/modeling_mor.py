"""Mixture-of-Recursions for ``transformers``: Vanilla, Recursive and MoR in one class.

Self-contained (torch and transformers only): ``python -m mor export-hf`` copies this file
next to ``config.json`` and the weights, and

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

loads it. It is the inference path of mor-repro (``mor.model``), written out as one pass
over the whole prefix: every token is computed at every layer, and each layer's keys are
masked to the tokens its keys/values hold (the ``full_forward_causal`` reference of
``mor/model/decode.py``, which the repository's cached decoding is tested against).

    embed -> prefix layers -> recursion 1 .. Nr (a chunk of shared layers each) -> suffix
          -> norm -> lm_head (tied to embed)

``config.layer_plan`` names the unique layer each effective layer runs, ``config.kv_producers``
the effective layer whose keys/values each one attends over (KV sharing). Routing
(``config.routing``, or ``routing=`` per call):

    causal  (default; generation)  expert-choice keeps token t at recursion r when it was
            kept at r-1 and its (auxiliary) router logit is > 0; a recursion of capacity 1
            keeps every candidate. Token-choice picks each token's depth from its own state.
    topk    (teacher-forced scoring, as trained) expert-choice keeps the top-k of each
            sequence per recursion (looks at the whole sequence: never for generation).

``generate()`` recomputes the whole prefix at every step (no KV cache): exact, not fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class MoRConfig(PretrainedConfig):
    """Shape (Llama names), the variant, the resolved tying plan and the router settings.

    ``mor`` holds the run's whole model config as mor-repro wrote it (every field); the
    fields below are what this file computes with."""

    model_type = "mor"

    def __init__(self, vocab_size: int = 4096, hidden_size: int = 96, intermediate_size: int = 256,
                 num_hidden_layers: int = 6, num_attention_heads: int = 4, num_key_value_heads: int = 2,
                 max_position_embeddings: int = 2048, rope_theta: float = 10000.0, rms_norm_eps: float = 1e-5,
                 initializer_range: float = 0.02, variant: str = "vanilla", num_recursions: int = 1,
                 kv: str = "recursion_wise", layer_plan: dict | None = None, kv_producers: list | None = None,
                 router: dict | None = None, router_capacities: list | None = None, routing: str = "causal",
                 max_depth: int | None = None, relaxation: str = "none", relaxation_rank: int = 0,
                 mor: dict | None = None, tie_word_embeddings: bool = True, **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers = num_hidden_layers  # unique layers (the weights stored)
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        self.max_position_embeddings, self.rope_theta, self.rms_norm_eps = max_position_embeddings, rope_theta, rms_norm_eps
        self.initializer_range = initializer_range
        self.hidden_act, self.attention_bias, self.mlp_bias = "silu", False, False
        self.variant, self.num_recursions, self.kv = variant, num_recursions, kv
        plan = layer_plan or {"prefix": [], "recursions": [list(range(num_hidden_layers))], "suffix": []}
        self.layer_plan = {k: [list(r) for r in v] if k == "recursions" else list(v) for k, v in plan.items()}
        order = [*plan["prefix"], *(u for rec in plan["recursions"] for u in rec), *plan["suffix"]]
        self.kv_producers = list(kv_producers) if kv_producers is not None else list(range(len(order)))
        self.router = dict(router or {})
        self.router_capacities = list(router_capacities or [])
        if routing not in ("causal", "topk"):
            raise ValueError(f"routing={routing!r}; choose 'causal' or 'topk'")
        self.routing, self.max_depth = routing, max_depth
        self.relaxation, self.relaxation_rank = relaxation, relaxation_rank
        self.mor = dict(mor or {})
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


# --------------------------------------------------------------------------------------
# Layers (mor/model/layers.py)
# --------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin at ``positions`` (T,): (1, 1, T, hd) each. HF Llama layout
    (dimension i pairs with i + hd/2); the rotation's sign is folded into sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = torch.outer(positions.float(), inv_freq)  # (T, hd/2)
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), -1)[None, None], torch.cat((-sin, sin), -1)[None, None]  # (1, 1, T, hd)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, hd) rotated in its own dtype."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, hd/2) each
    return x * cos + torch.cat((x2, x1), dim=-1) * sin


def project(lin: nn.Linear, name: str, x: torch.Tensor, slot) -> torch.Tensor:
    """lin(x), plus the relaxation slot's low-rank delta for projection ``name`` (LoRA/DoRA)."""
    out = lin(x)
    return out if slot is None else slot[name](x, out, lin.weight)


class Attention(nn.Module):
    """Grouped-query attention over keys/values given from outside, under a boolean mask."""

    def __init__(self, cfg: MoRConfig):
        super().__init__()
        C, hd = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(C, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(C, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(C, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, C, bias=False)

    def project_kv(self, x: torch.Tensor, rot, slot=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values of x (B, T, C): (B, Hkv, T, hd) each."""
        B, T, _ = x.shape  # batch, tokens, channels
        k = project(self.k_proj, "k_proj", x, slot).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = project(self.v_proj, "v_proj", x, slot).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(k, *rot), v  # (B, Hkv, T, hd) each

    def forward(self, x: torch.Tensor, rot, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                slot=None) -> torch.Tensor:
        """x: (B, T, C); k, v: (B, Hkv, S, hd); mask (B, 1, T, S) bool, True = may attend."""
        B, T, C = x.shape  # batch, tokens, channels
        q = project(self.q_proj, "q_proj", x, slot).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, *rot)  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return project(self.o_proj, "o_proj", y.transpose(1, 2).reshape(B, T, C), slot)  # (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, cfg: MoRConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, slot=None) -> torch.Tensor:
        gate = F.silu(project(self.gate_proj, "gate_proj", x, slot))
        return project(self.down_proj, "down_proj", gate * project(self.up_proj, "up_proj", x, slot), slot)


class Block(nn.Module):
    """Pre-norm decoder layer (Llama parameter names)."""

    def __init__(self, cfg: MoRConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg)

    def project_kv(self, x, rot, slot=None):
        return self.self_attn.project_kv(self.input_layernorm(x), rot, slot)

    def forward(self, x, rot, k, v, mask, slot=None):
        x = x + self.self_attn(self.input_layernorm(x), rot, k, v, mask, slot)
        return x + self.mlp(self.post_attention_layernorm(x), slot)


# --------------------------------------------------------------------------------------
# Relaxations (mor/model/relax.py): per (unique layer, recursion) slot, or per recursion
# --------------------------------------------------------------------------------------
LORA_TARGETS = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                "down_proj": "mlp.down_proj"}


def relaxed_slots(plan: dict) -> list[tuple[int, int]]:
    """(unique layer, recursion) pairs the recursions run, each once, in run order."""
    return list(dict.fromkeys((u, r) for r, rec in enumerate(plan["recursions"]) for u in rec))


def slot_name(u: int, r: int) -> str:
    return f"layer{u}_rec{r}"


class LowRankDelta(nn.Module):
    """LoRA: W x + s B A x (s = 2); DoRA: that times magnitude / row norm of W + s B A."""

    def __init__(self, in_features: int, out_features: int, rank: int, dora: bool):
        super().__init__()
        self.scale = 2.0  # alpha / rank with alpha = 2 * rank
        self.A = nn.Parameter(torch.zeros(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))
        self.magnitude = nn.Parameter(torch.ones(out_features)) if dora else None

    def row_norm(self, weight: torch.Tensor) -> torch.Tensor:
        """||W + s B A|| of each output row (out,), fp32, without forming the merged matrix."""
        W, A, B = weight.float(), self.A.float(), self.B.float()
        wa = W @ A.T  # (out, rank)
        sq = W.pow(2).sum(1) + 2 * self.scale * (wa * B).sum(1) + self.scale**2 * ((B @ (A @ A.T)) * B).sum(1)
        return sq.clamp_min(1e-12).sqrt()

    def forward(self, x: torch.Tensor, base_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = base_out + self.scale * F.linear(F.linear(x, self.A.to(x.dtype)), self.B.to(x.dtype))
        if self.magnitude is None:
            return out
        return out * (self.magnitude / self.row_norm(weight)).to(out.dtype)


class Relaxation(nn.Module):
    """lora / dora: ``slots[layer{u}_rec{r}][proj]``; prefix: ``slots[layer{u}_rec{r}]`` (2, Hkv, P, hd)
    learned keys/values every query sees; recursion_pe: ``gains[r]`` (C,) multiplied into
    the output of recursion r."""

    def __init__(self, cfg: MoRConfig):
        super().__init__()
        self.kind, rank = cfg.relaxation, cfg.relaxation_rank
        slots = relaxed_slots(cfg.layer_plan)
        if self.kind in ("lora", "dora"):
            C, M, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
            shapes = {"q_proj": (C, cfg.num_attention_heads * hd), "k_proj": (C, cfg.num_key_value_heads * hd),
                      "v_proj": (C, cfg.num_key_value_heads * hd), "o_proj": (cfg.num_attention_heads * hd, C),
                      "gate_proj": (C, M), "up_proj": (C, M), "down_proj": (M, C)}
            self.slots = nn.ModuleDict({slot_name(u, r): nn.ModuleDict(
                {n: LowRankDelta(*shapes[n], rank, self.kind == "dora") for n in LORA_TARGETS}) for u, r in slots})
        elif self.kind == "prefix":
            self.slots = nn.ParameterDict({slot_name(u, r): nn.Parameter(
                torch.zeros(2, cfg.num_key_value_heads, rank, cfg.head_dim)) for u, r in slots})
        elif self.kind == "recursion_pe":
            self.gains = nn.ParameterList(nn.Parameter(torch.ones(cfg.hidden_size))
                                          for _ in cfg.layer_plan["recursions"])
        else:
            raise ValueError(f"unknown relaxation {self.kind!r}")

    def deltas(self, u: int, r: int | None):
        """The LoRA/DoRA deltas of slot (u, r); None for other relaxations and unshared layers."""
        return self.slots[slot_name(u, r)] if self.kind in ("lora", "dora") and r is not None else None

    def prefix(self, u: int, r: int | None, k, v, mask):
        """Prefix: the slot's keys/values in front of k, v (B, Hkv, S, hd), all visible."""
        if self.kind != "prefix" or r is None:
            return k, v, mask
        B = k.shape[0]
        pk, pv = self.slots[slot_name(u, r)].to(k.dtype).unsqueeze(1).expand(-1, B, -1, -1, -1)  # (B, Hkv, P, hd)
        see = mask.new_ones((*mask.shape[:-1], pk.shape[2]))  # (B, 1, T, P)
        return torch.cat([pk, k], 2), torch.cat([pv, v], 2), torch.cat([see, mask], -1)

    def end_recursion(self, r: int, h: torch.Tensor) -> torch.Tensor:
        return h * self.gains[r].to(h.dtype) if self.kind == "recursion_pe" else h


# --------------------------------------------------------------------------------------
# Routers (mor/model/router.py, routing.py)
# --------------------------------------------------------------------------------------
def router_head(hidden: int, arch: str, out: int = 1) -> nn.Module:
    """linear | 2-layer MLP with GELU | Wide-MLP (hidden layer 4x wider)."""
    if arch == "linear":
        return nn.Linear(hidden, out, bias=False)
    width = hidden if arch == "mlp" else 4 * hidden
    return nn.Sequential(nn.Linear(hidden, width, bias=False), nn.GELU(), nn.Linear(width, out, bias=False))


def router_func(logits: torch.Tensor, func: str, alpha: float) -> torch.Tensor:
    if func == "sigmoid":
        return alpha * torch.sigmoid(logits)
    if func == "tanh":
        return alpha * torch.tanh(logits)
    if func == "softmax":
        return alpha * torch.softmax(logits, dim=-1)
    return alpha * logits  # 'none'


class Router(nn.Module):
    """Expert-choice (one per recursion, ``out`` 1) or token-choice (one, ``out`` Nr) router."""

    def __init__(self, cfg: MoRConfig, out: int):
        super().__init__()
        r = cfg.router
        self.head = router_head(cfg.hidden_size, r["arch"], out)
        self.aux_head = router_head(cfg.hidden_size, r["arch"], out) if out == 1 and r["aux"] == "aux_router" else None
        loss_free = out > 1 and r["balancing"] == "loss_free"
        self.bias = nn.Parameter(torch.zeros(out), requires_grad=False) if loss_free else None
        self.temperature, self.out = r["temperature"], out

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T) expert-choice, (B, T, Nr) token-choice; tempered."""
        x = self.head(h)  # (B, T, out)
        x = x.squeeze(-1) if self.out == 1 else x
        return x if self.temperature == 1.0 else x / self.temperature

    def causal_logits(self, h: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Logits whose sign is the causal keep decision (the aux router's when it has one)."""
        return logits if self.aux_head is None else self.aux_head(h).squeeze(-1)


def tokens_kept(seq_len: int, fraction: float, rounding: str) -> int:
    """Top-k size for one sequence: at least one token, never more than the sequence
    (mor.capacity.tokens_kept: "floor" int(fraction * T), "ceil" never below the fraction)."""
    if rounding == "floor":
        return max(1, min(seq_len, int(fraction * seq_len)))
    return max(1, min(seq_len, math.ceil(seq_len * fraction - 1e-9)))


@dataclass
class TokenDepths:
    h1: torch.Tensor  # (B, T, C) state entering the recursion stack
    depth_id: torch.Tensor  # (B, T) depth - 1
    g: torch.Tensor  # (B, T) alpha * score of the chosen depth


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------
class MoRPreTrainedModel(PreTrainedModel):
    config_class = MoRConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)


class MoRModel(MoRPreTrainedModel):
    """Embedding, unique layers, routers and final norm; ``forward`` returns the normed states."""

    def __init__(self, config: MoRConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.routers = nn.ModuleList()
        if config.variant == "mor" and config.router["type"] == "token_choice":
            self.routers.append(Router(config, config.num_recursions))
        elif config.variant == "mor":
            self.routers.extend(Router(config, 1) for _ in range(config.num_recursions))
        self.relax = Relaxation(config) if config.relaxation != "none" else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    @property
    def token_choice(self) -> bool:
        return bool(self.routers) and self.config.router["type"] == "token_choice"

    def token_depths(self, h: torch.Tensor, max_depth: int) -> TokenDepths:
        """Token-choice: each token's depth from its own state h (B, T, C), before recursion 1."""
        r, router = self.config.router, self.routers[0]
        logits = router.logits(h)  # (B, T, Nr)
        scores = router_func(logits, r["func"], 1.0)  # (B, T, Nr)
        probs = scores if r["func"] in ("softmax", "sigmoid") else torch.softmax(logits, dim=-1)
        p = probs.detach().float()
        depth_id = (p if router.bias is None else p + router.bias).argmax(-1)  # (B, T)
        g = r["alpha"] * scores.gather(-1, depth_id.unsqueeze(-1)).squeeze(-1)  # (B, T)
        return TokenDepths(h, depth_id.clamp(max=max_depth - 1), g)

    def decide(self, r: int, h, active, n_active: int, routing: str, depths: TokenDepths | None):
        """(keep (B, T) bool, router weight g (B, T) or None, candidates kept per sequence)."""
        if depths is not None:
            return active & (depths.depth_id >= r), None, n_active
        rc, router = self.config.router, self.routers[r]
        logits = router.logits(h)  # (B, T)
        g = router_func(logits, rc["func"], rc["alpha"])  # (B, T)
        cap = self.config.router_capacities[r]
        if routing == "causal":
            keep = active if cap >= 1 else active & (router.causal_logits(h, logits) > 0)
            return keep, g, n_active
        T = h.shape[1]
        k = min(tokens_kept(T, cap, rc.get("capacity_rounding", "ceil")), n_active)  # exports before issue 56: ceil
        if k == T:
            return active, g, k
        masked = logits.detach() if n_active == T else logits.detach().masked_fill(~active, float("-inf"))
        idx = masked.topk(k, dim=1).indices  # (B, k)
        return torch.zeros_like(active).scatter(1, idx, True), g, k

    def gate(self, x0, out, g, relative: bool = True):
        """State after a recursion (expert-choice) or after the stack (token-choice, absolute)."""
        if g is None:
            return out
        g = g.unsqueeze(-1).to(out.dtype)  # (B, T, 1)
        if self.config.router["gating"] == "additive":
            return out + g
        if relative and self.config.router.get("combine", "layer_update") == "layer_update":  # exports before issue 56
            return x0 + g * (out - x0)
        return torch.addcmul(x0, g, out)  # x0 + g * out: token-choice, and expert-choice 'layer_output'


    def forward(self, input_ids: torch.Tensor, routing: str | None = None, max_depth: int | None = None):
        """input_ids (B, T) -> (normed states (B, T, C), recursions each token ran (B, T) or None)."""
        cfg, plan = self.config, self.config.layer_plan
        routing = routing or cfg.routing
        if routing not in ("causal", "topk"):
            raise ValueError(f"routing={routing!r}; choose 'causal' or 'topk'")
        nr = len(plan["recursions"])
        depth = max_depth or cfg.max_depth or nr
        if not 1 <= depth <= nr:
            raise ValueError(f"max_depth must be in 1..{nr}, got {depth}")
        B, T = input_ids.shape  # batch, tokens
        if T > cfg.max_position_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings {cfg.max_position_embeddings}")
        dev = input_ids.device
        rot = rope_tables(torch.arange(T, device=dev), cfg.head_dim, cfg.rope_theta)  # (1, 1, T, hd) each
        causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()  # (T, T)
        eye = torch.eye(T, dtype=torch.bool, device=dev)  # rows of dropped tokens are never empty
        everyone = torch.ones(B, T, dtype=torch.bool, device=dev)  # (B, T)
        store: dict = {}  # producer effective layer -> (k, v, tokens its KV holds (B, T))

        def layer(e: int, u: int, x, keep, r: int | None = None):
            """Effective layer e (unique layer u, recursion r or None) on all T tokens; its keys
            restricted to the tokens its keys/values hold."""
            slot = self.relax.deltas(u, r) if self.relax is not None else None
            p = cfg.kv_producers[e]
            if p == e:
                k, v = self.layers[u].project_kv(x, rot, slot)  # (B, Hkv, T, hd) each
                held = keep
                store[e] = (k, v, keep)
            else:
                k, v, held = store[p]
                if cfg.kv == "shared_dagger":  # the tokens that reached e refresh their entries
                    fk, fv = self.layers[u].project_kv(x, rot, slot)
                    fresh = keep[:, None, :, None]  # (B, 1, T, 1)
                    k, v = torch.where(fresh, fk, k), torch.where(fresh, fv, v)
            mask = ((causal & held.unsqueeze(1)) | eye).unsqueeze(1)  # (B, 1, T, T)
            if self.relax is not None:
                k, v, mask = self.relax.prefix(u, r, k, v, mask)  # (B, Hkv, P+T, hd), (B, 1, T, P+T)
            return self.layers[u](x, rot, k, v, mask, slot)

        h = self.embed_tokens(input_ids)  # (B, T, C)
        e = 0
        for u in plan["prefix"]:
            h = layer(e, u, h, everyone)
            e += 1
        state = self.token_depths(h, depth) if self.token_choice else None
        active, n_active = everyone, T
        ran = torch.zeros(B, T, dtype=torch.long, device=dev) if self.routers else None
        for r, rec in enumerate(plan["recursions"]):
            if r >= depth:
                e += len(rec)
                continue
            if self.routers:
                keep, g, n_active = self.decide(r, h, active, n_active, routing, state)
            else:
                keep, g = everyone, None
            out = h
            for u in rec:
                out = layer(e, u, out, keep, r)
                e += 1
            if self.relax is not None:
                out = self.relax.end_recursion(r, out)
            new = self.gate(h, out, g) if self.routers else out
            h = torch.where(keep.unsqueeze(-1), new, h)  # (B, T, C)
            if ran is not None:
                ran += keep.long()
            active = keep
        if state is not None:
            h = self.gate(state.h1, h, state.g, relative=False)
        for u in plan["suffix"]:
            h = layer(e, u, h, everyone)
            e += 1
        return self.norm(h), ran


@dataclass
class MoRCausalLMOutput(CausalLMOutputWithPast):
    """``depths`` (B, T): recursions each token ran (None for unrouted models)."""

    depths: torch.Tensor | None = None


class MoRForCausalLM(MoRPreTrainedModel, GenerationMixin):
    """Logits from the tied embedding (no separate lm_head weight)."""

    def __init__(self, config: MoRConfig):
        super().__init__(config)
        self.model = MoRModel(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return None

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """No KV cache: every step runs the whole prefix (causal routing decides per token)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, routing: str | None = None, max_depth: int | None = None,
                logits_to_keep: int = 0, return_dict: bool | None = None, **kwargs) -> MoRCausalLMOutput:
        """input_ids (B, T); ``labels`` (B, T) as input_ids (shifted inside, -100 = ignore);
        ``routing`` 'causal' / 'topk' overrides config.routing for this call."""
        if input_ids is None:
            raise ValueError("MoRForCausalLM needs input_ids (inputs_embeds are not supported)")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("padded batches are not supported: every attention_mask entry must be 1")
        h, depths = self.model(input_ids, routing=routing, max_depth=max_depth)  # (B, T, C)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits = F.linear(h, self.model.embed_tokens.weight)  # (B, T or n, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return MoRCausalLMOutput(loss=loss, logits=logits, depths=depths)

