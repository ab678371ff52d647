"""Llama-style building blocks: RMSNorm, RoPE, grouped-query attention, SwiGLU, Block.

Every block takes explicit ``positions`` because MoR runs a recursion on a gathered
subsequence of tokens whose original positions are not 0..k-1 (RoPE must see the real
ones). Attention uses flash-attn when it is installed, the tensors are on a GPU in
fp16/bf16, and the config allows it; otherwise torch SDPA. Attention under an explicit mask
(KV sharing, prefix relaxation, the decode cache) takes FlexAttention or the chunked SDPA
path below, as ``mor.model.flex.masked_path`` decides (``attend_masked``).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from mor.model.flex import flex_available, flex_masked_attention, masked_path

try:  # optional GPU extra: pip install 'mor-repro[gpu]'
    from flash_attn import flash_attn_func as _flash_attn_func
except ImportError:  # CPU machines, or CUDA without the wheel
    _flash_attn_func = None


def flash_available() -> bool:
    return _flash_attn_func is not None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """RoPE tables computed once; looked up by arbitrary integer positions.

    HF Llama layout: dimension i pairs with i + hd/2 ("first half / second half"), which is
    what HF-format checkpoints expect. The tables are stored at full head width with the
    rotation's sign folded into ``sin``, so rotating is ``x * cos + rotate_half(x) * sin``
    (two muls and an add, instead of four muls, an add and a sub on the halves).

    No bounds check on ``positions``: it would cost a reduction and a device sync per call.
    Positions are validated where they enter, from Python ints: ``MoRTransformer.forward`` and
    decode's reference forward (T <= max_seq_len); cached decoding's ``init_cache``
    (max_len <= max_seq_len) plus ``KVCache.check`` (never more than max_len tokens).
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (P, hd/2)
        cos, sin = freqs.cos(), freqs.sin()
        self.register_buffer("cos", torch.cat((cos, cos), dim=-1), persistent=False)  # (P, hd)
        self.register_buffer("sin", torch.cat((-sin, sin), dim=-1), persistent=False)  # (P, hd)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at ``positions`` (B, T): (B|1, 1, T, hd) each, broadcast over heads.

        Positions whose rows are all one expanded row (stride 0, e.g. ``arange(T).expand(B, T)``
        of a full forward) are looked up once instead of B times."""
        if positions.dim() == 2 and positions.stride(0) == 0:
            positions = positions[:1]  # (1, T): every row is this one
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # (B|1, 1, T, hd)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (B, H, T, hd); positions: (B, T) long."""
        return apply_rotary(x, *self.tables(positions))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, hd) rotated by tables from ``RotaryEmbedding.tables``, in x's dtype
    (bf16 under autocast, where the tables are fp32)."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, hd/2) each
    return x * cos + torch.cat((x2, x1), dim=-1) * sin  # sin's first half is negated


class Attention(nn.Module):
    """Causal grouped-query self-attention over the tokens it is given."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, backend: str = "auto"):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        if backend == "flash" and not flash_available():
            raise RuntimeError("model.attention='flash' but flash_attn is not installed (pip install '.[gpu]')")
        if backend == "flex" and not flex_available():
            raise RuntimeError("model.attention='flex' needs torch >= 2.5 (FlexAttention), "
                               f"this is {torch.__version__}")
        self.backend = backend

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding):
        """Keys and values of x: (B, Hkv, T, hd) each, keys already rotated."""
        return self._kv(x, rope.tables(positions))

    def _kv(self, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor]):
        """``project_kv`` with the RoPE tables already looked up (shared with the queries)."""
        B, T, _ = x.shape  # batch, tokens, channels
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        return apply_rotary(k, *rot), v

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, C). ``kv`` replaces this layer's own keys/values (KV sharing, caches), or
        is an object whose ``attend(q (B, H, T, hd)) -> (B, H, T, hd)`` does the attention
        (the engine's static cache; with ``stores`` true its ``store(k, v)`` takes this call's
        keys/values first, those ``project_kv`` gives); ``attn_mask`` (B, 1, T, S) bool overrides the plain causal mask."""
        B, T, C = x.shape  # batch, tokens, channels
        rot = rope.tables(positions)  # looked up once for queries and keys
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        q = apply_rotary(q, *rot)
        if hasattr(kv, "attend"):  # a KV store that attends itself (mor.engine's per-slot cache)
            if getattr(kv, "stores", False):  # it takes this call's keys/values first: one norm, one RoPE lookup
                kv.store(*self._kv(x, rot))
            return self.o_proj(kv.attend(q).transpose(1, 2).reshape(B, T, C))  # (B, H, T, hd) -> (B, T, C)
        k, v = kv if kv is not None else self._kv(x, rot)  # (B, Hkv, S, hd)
        causal_square = attn_mask is None and k.shape[2] == T
        if self._use_flash(q) and causal_square:
            y = _flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
            y = y.reshape(B, T, C)  # flash returns (B, T, H, hd)
        else:
            gqa = self.kv_heads != self.heads
            if attn_mask is not None:
                y = attend_masked(q, k, v, attn_mask, gqa, self.backend)  # (B, H, T, hd)
            elif causal_square:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)  # (B, H, T, hd)
            else:
                raise ValueError(f"attention over {k.shape[2]} keys for {T} queries needs an explicit attn_mask")
            y = y.transpose(1, 2).reshape(B, T, C)
        return self.o_proj(y)

    def _use_flash(self, q: torch.Tensor) -> bool:
        return (
            self.backend in ("auto", "flash")
            and _flash_attn_func is not None
            and q.is_cuda
            and q.dtype in (torch.float16, torch.bfloat16)
        )


def attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, gqa: bool,
                  backend: str = "auto") -> torch.Tensor:
    """Attention under an explicit mask through the path ``masked_path`` picks for this call:
    FlexAttention (``mor.model.flex``) or the chunked SDPA fallback (``masked_attention``).
    Shapes as ``masked_attention``'s: q (B, H, Tq, hd) -> (B, H, Tq, hd)."""
    grad = q.requires_grad or k.requires_grad or v.requires_grad  # autograd records this call
    path = masked_path(backend, q.device.type, grad, mask.dtype == torch.bool)
    if path == "flex":
        return flex_masked_attention(q, k, v, mask, gqa)
    return masked_attention(q, k, v, mask, gqa)


QUERY_CHUNK = 64  # queries per masked_attention chunk
CHUNK_MIN_KEYS = 256  # below this many keys one masked call is faster than chunks (CPU, measured)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, gqa: bool) -> torch.Tensor:
    """SDPA under an explicit mask, giving each chunk of queries only the keys it can see.

    KV sharing makes the routed queries of a recursion attend over every key recursion 1
    computed, causally by position: the mask is a staircase (query at position p sees keys
    0..p). A fused kernel cannot skip masked blocks, so one call computes all k x S scores
    and throws about half away. Split into chunks of ``QUERY_CHUNK`` queries, each chunk
    attends over the key prefix up to the last key any of its rows sees: exact (the dropped
    keys are masked for every row of the chunk, so they add nothing to the softmax, and
    their gradients are zero); fwd+bwd of 341 / 171 routed queries over 512 keys (16
    sequences, 4 heads of 24) took 24 / 32 % less time on CPU. Any other mask (the decode
    cache's, a prefix relaxation's all-True prefix columns) is handled the same way; one
    whose chunks all need every key, or with fewer than ``CHUNK_MIN_KEYS`` keys, runs as one
    call. Costs one host sync per call to read the chunk limits.

    q: (B, H, Tq, hd); k, v: (B, Hkv, S, hd); mask: (B|1, 1|H, Tq, S), bool (True = may
    attend) or additive float (never chunked).
    """
    Tq, S = q.shape[2], k.shape[2]
    if mask.dtype != torch.bool or S < CHUNK_MIN_KEYS or Tq <= QUERY_CHUNK:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)  # (B, H, Tq, hd)
    mask = mask.expand(-1, -1, Tq, S)  # a mask broadcast over queries has one row per query now
    seen = mask.any(0).any(0)  # (Tq, S) keys some sequence / head lets each query see
    last = S - seen.flip(-1).to(torch.uint8).argmax(-1)  # (Tq,) 1 + last seen key (S if none)
    chunks = -(-Tq // QUERY_CHUNK)
    limits = F.pad(last, (0, chunks * QUERY_CHUNK - Tq)).view(chunks, QUERY_CHUNK).amax(1).tolist()  # host sync
    starts = range(0, Tq, QUERY_CHUNK)
    if min(limits) == S:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    ys = [
        F.scaled_dot_product_attention(
            q[:, :, s : s + QUERY_CHUNK], k[:, :, :n], v[:, :, :n], attn_mask=mask[..., s : s + QUERY_CHUNK, :n],
            enable_gqa=gqa,
        )
        for s, n in zip(starts, limits)
    ]  # (B, H, chunk, hd) each
    return torch.cat(ys, dim=2)  # (B, H, Tq, hd)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, mlp: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, mlp, bias=False)
        self.up_proj = nn.Linear(hidden, mlp, bias=False)
        self.down_proj = nn.Linear(mlp, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, mlp: int, eps: float, backend: str = "auto"):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, heads, kv_heads, backend)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(hidden, mlp)

    def project_kv(self, x, positions, rope, attn: Attention | None = None):
        """The keys/values this layer's attention computes from x: (B, Hkv, T, hd) each.

        Lets KV sharing and the decode cache compute (or skip) a layer's KV outside
        ``forward`` and hand it back through ``kv=``. ``attn``: another attention module in
        place of the layer's own (model.recursion_attention 'untied', recursion r > 1)."""
        return (attn or self.self_attn).project_kv(self.input_layernorm(x), positions, rope)

    def forward(self, x, positions, rope, kv=None, attn_mask=None, attn: Attention | None = None):
        x = x + (attn or self.self_attn)(self.input_layernorm(x), positions, rope, kv=kv, attn_mask=attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def init_weights(module: nn.Module, std: float, depth: int, residual_init: str = "scaled") -> None:
    """N(0, std) from the global stream; residual output projections scaled by 1/sqrt(2*depth)
    under residual_init "scaled" (GPT-2/nanoGPT), not under "normal" (HF, the authors')."""
    from mor.model.init import residual_scale  # init.py imports nothing of layers.py

    for name, p in module.named_parameters():
        if p.dim() < 2:
            continue
        nn.init.normal_(p, mean=0.0, std=std * residual_scale(name, depth, residual_init))
