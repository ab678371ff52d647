"""The engine's paged KV cache on the device: one pool of blocks, written and read by index.

Shape contract (allocated once, never reallocated):

    k, v   (num_blocks + 1, block_size, Hkv, hd)   keys (rotated by RoPE) and values; block
                                                   ``num_blocks`` is the trash block
    flat   k.view(-1, Hkv, hd): entry ``slot`` = block * block_size + offset

Which sequence and layer owns a block is blocks.py's business (host). A pass hands this
module flat write slots (padded rows and rows with nothing to write point at the trash
block, so a write is one ``index_copy_`` with no mask and no host sync) and, per row, a
block-table row (n, MB) int32 and a length (n,) int32 to attend over:

    GPU (flash-attn installed, fp16/bf16, block_size % 256 == 0)     backend 'flash_paged'
        flash_attn_with_kvcache(q, k, v, cache_seqlens, block_table): no gather, each row
        reads its own length whatever the table's width
    otherwise                                                          backend 'sdpa_gathered'
        SDPA over the gathered blocks (n, Hkv, MB * block_size, hd), masked by length, the
        query heads of one KV head folded into its query rows: (n, Hkv, G, hd) against
        (n, Hkv, T, hd), so GQA reads K/V once per KV head (no expansion, no enable_gqa) and
        SDPA keeps a fused kernel (with a mask: the memory-efficient one on a GPU, the CPU's
        flash kernel on a CPU)

``paged_attention`` is the one implementation every pass calls (``PagedView.attend``) and
``attention_backend`` the one decision. The gathered path reads MB blocks per row, so its
cost follows the table's width: the engine gives every pass the narrowest power-of-two width
that holds its longest row (a static shape per width on the graph path, step.py), so a pass
reads about its rows' context, not ``max_len`` (``kv_bytes``: what a pass reads).

Every entry a row reads is a past token of its sequence or the current one (one token per
sequence is in flight), so the length mask is the whole causal mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # optional GPU extra
    from flash_attn import flash_attn_with_kvcache as _flash_with_kvcache
except ImportError:
    _flash_with_kvcache = None

FLASH_PAGE = 256  # flash-attn's paged KV needs block sizes divisible by this


def flash_paged(device) -> bool:
    """Whether passes on ``device`` attend with flash-attn's paged KV-cache kernel."""
    return _flash_with_kvcache is not None and torch.device(device).type == "cuda"


def attention_backend(device, dtype, block_size: int) -> str:
    """Which kernel a pass's paged attention runs: 'flash_paged' (flash-attn installed, a GPU,
    fp16 / bf16, block_size a multiple of 256) or 'sdpa_gathered'."""
    ok = flash_paged(device) and dtype in (torch.float16, torch.bfloat16) and block_size % FLASH_PAGE == 0
    return "flash_paged" if ok else "sdpa_gathered"


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor,
                    lengths: torch.Tensor) -> torch.Tensor:
    """One token per row over its paged context. q (n, H, 1, hd); pools (NB + 1, bs, Hkv, hd);
    table (n, MB) int32 block ids; lengths (n,) int32 entries each row reads -> (n, H, 1, hd)."""
    if attention_backend(q.device, q.dtype, k_pool.shape[1]) == "flash_paged":
        y = _flash_with_kvcache(q.transpose(1, 2), k_pool, v_pool, cache_seqlens=lengths,
                                block_table=table, causal=False)  # (n, 1, H, hd)
        return y.transpose(1, 2)
    n, H, _, hd = q.shape
    MB, bs, Hkv = table.shape[1], k_pool.shape[1], k_pool.shape[2]
    T = MB * bs
    k = k_pool[table].view(n, T, Hkv, hd).transpose(1, 2)  # (n, MB, bs, Hkv, hd) -> (n, Hkv, T, hd)
    v = v_pool[table].view(n, T, Hkv, hd).transpose(1, 2)  # (n, Hkv, T, hd)
    mask = (torch.arange(T, device=q.device) < lengths.unsqueeze(1))[:, None, None, :]  # (n, 1, 1, T)
    qg = q.view(n, Hkv, H // Hkv, hd)  # (n, Hkv, G, hd): query heads h = g_kv * G + i, as GQA groups them
    return F.scaled_dot_product_attention(qg, k, v, attn_mask=mask).view(n, H, 1, hd)


def kv_bytes(backend: str, rows: int, width: int, lengths_sum: int, block_size: int, kv_heads: int, head_dim: int,
             elem: int) -> int:
    """Bytes of K and V one layer call reads: flash_paged each row's own entries (lengths),
    sdpa_gathered every entry of the table's ``width`` blocks per row."""
    entries = lengths_sum if backend == "flash_paged" else rows * width * block_size
    return 2 * entries * kv_heads * head_dim * elem


class PagedCache:
    def __init__(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype, device):
        shape = (num_blocks + 1, block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (NB + 1, bs, Hkv, hd)
        self.v = torch.zeros_like(self.k)
        self.block_size, self.trash = block_size, num_blocks

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots (W, n) flat entries (trash for no write); k, v (n, Hkv, 1, hd) of the n rows."""
        W = slots.shape[0]
        k = k[:, :, 0].repeat(W, 1, 1)  # (W * n, Hkv, hd): row i's KV at each of its W targets
        v = v[:, :, 0].repeat(W, 1, 1)
        flat = slots.reshape(-1)  # (W * n,)
        self.k.view(-1, *self.k.shape[2:]).index_copy_(0, flat, k)
        self.v.view(-1, *self.v.shape[2:]).index_copy_(0, flat, v)

    def write_prefill(self, flat: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Prefilled entries of one layer: flat (n,) pool entries, k, v (n, Hkv, hd) one row each."""
        self.k.view(-1, *self.k.shape[2:]).index_copy_(0, flat, k.to(self.k.dtype))
        self.v.view(-1, *self.v.shape[2:]).index_copy_(0, flat, v.to(self.v.dtype))

    def view(self, table: torch.Tensor, lengths: torch.Tensor, writes: torch.Tensor | None = None) -> "PagedView":
        return PagedView(self, table, lengths, writes)


class PagedView:
    """What one layer call attends over, passed as ``kv=`` (``layers.Attention`` calls
    ``attend``): table (n, MB) int32 block ids per row, lengths (n,) int32; with ``writes``
    (W, n) flat slots the layer first hands it its keys and values (``store``: the layer
    computes them from its own normed input, so a pass norms and looks RoPE up once per
    layer call, not twice)."""

    def __init__(self, cache: PagedCache, table: torch.Tensor, lengths: torch.Tensor,
                 writes: torch.Tensor | None = None):
        self.cache, self.table, self.lengths, self.writes = cache, table, lengths, writes

    @property
    def stores(self) -> bool:
        return self.writes is not None

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v (n, Hkv, 1, hd): this call's keys (rotated) and values, written at ``writes``."""
        self.cache.write(self.writes, k, v)

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """q: (n, H, 1, hd) -> (n, H, 1, hd) (``paged_attention``)."""
        return paged_attention(q, self.cache.k, self.cache.v, self.table, self.lengths)
