"""KV bookkeeping of the engine: one static-size cache row per sequence slot.

It is ``mor.model.kv_cache.KVCache`` built once for ``capacity`` rows of ``max_len``
entries (the same layout ``decode.prefill`` fills, so a prompt is prefilled alone and its
row copied in), and never reallocated: every write is an index write at (slot, entry).

    slot e (own / dagger)  k, v (capacity, Hkv, max_len, hd); pos (capacity, max_len);
                           length (capacity,) entries filled per row, in position order

Per KV strategy (``model.cfg.kv``, kv_cache.py):
  recursion-wise  a token appends to the slot of each layer it runs, so a token that exits
                  at depth r writes no KV for the deeper recursions (those rows are shorter)
  shared          recursion r > 1 layers read their recursion-1 producer's slot
  shared_dagger   a dagger slot mirrors its producer entry by entry (the producer's append
                  writes both, at the same entry), and a token that reaches the dagger
                  layer overwrites its own entry there with fresh KV

Every entry of a row is a past token or the current one (one token per sequence in
flight), so attention over a row is masked by its length only. ``max_len`` sizing is
'full' (the memory model of the throughput protocol, mor.flops, counts recursion-wise
savings; this cache does not shrink them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mor.model.kv_cache import EMPTY, KVCache

try:  # optional GPU extra
    from flash_attn import flash_attn_with_kvcache as _flash_with_kvcache
except ImportError:
    _flash_with_kvcache = None


class SlotCache:
    """The engine's static cache (see the module docstring)."""

    def __init__(self, model, capacity: int, max_len: int, dtype, device):
        from mor.model.decode import init_cache

        self.cache: KVCache = init_cache(model, capacity, max_len, dtype=dtype, device=device)
        self.specs = self.cache.specs
        # producer -> the dagger slots that mirror it
        self.mirrors: dict[int, list[int]] = {}
        for e, s in enumerate(self.specs):
            if s.kind == "dagger":
                self.mirrors.setdefault(s.source, []).append(e)

    # ------------------------------------------------------------------ rows
    def load(self, slot: int, prefilled: KVCache) -> None:
        """Copy a prompt's batch-1 cache (``decode.prefill``, same max_len) into row ``slot``."""
        for e, src in prefilled.slots.items():
            if self.specs[e].kind == "dagger":
                src.mirror(prefilled.slots[self.specs[e].source])  # bring its lazy mirror up to date
            dst = self.cache.slots[e]
            dst.k[slot], dst.v[slot] = src.k[0], src.v[0]
            dst.pos[slot], dst.length[slot] = src.pos[0], src.length[0]

    def clear(self, slot: int) -> None:
        for s in self.cache.slots.values():
            s.pos[slot] = EMPTY
            s.length[slot] = 0

    # ------------------------------------------------------------------ writes
    def write(self, e: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Effective layer e computed k, v (n, Hkv, 1, hd) for one token of each row ``slots`` (n,)
        at positions pos (n, 1): append them (own slot, and its dagger mirrors) or, for a dagger
        layer, overwrite the token's mirrored entry with its fresh KV."""
        spec = self.specs[e]
        k, v, p = k[:, :, 0], v[:, :, 0], pos[:, 0]  # (n, Hkv, hd), (n, Hkv, hd), (n,)
        if spec.kind == "dagger":
            s = self.cache.slots[e]
            entry = s.length[slots] - 1  # (n,) the entry the producer's append gave this token
            s.k[slots, :, entry], s.v[slots, :, entry] = k, v
            return
        for t in (e, *self.mirrors.get(e, ())):
            s = self.cache.slots[t]
            entry = s.length[slots]  # (n,)
            s.k[slots, :, entry], s.v[slots, :, entry] = k, v  # (n, Hkv, hd) each
            s.pos[slots, entry] = p
            s.length[slots] = entry + 1

    def view(self, e: int, slots: torch.Tensor, span: int) -> "SlotKV":
        """What layer e attends over for rows ``slots``: the first ``span`` entries of each row
        (span >= every row's length; the engine passes max position + 1)."""
        return SlotKV(self.cache.slot(e), slots, span)


class SlotKV:
    """Attention of one query token per row over its sequence's cache row (passed as ``kv=``
    to the layer: ``layers.Attention`` calls ``attend``). flash-attn's KV-cache kernel (per-row
    lengths, rows picked by index: no gather) on a GPU in fp16/bf16 when it is installed;
    otherwise SDPA over the gathered rows with a length mask."""

    def __init__(self, slot, slots: torch.Tensor, span: int):
        self.slot, self.slots, self.span = slot, slots, span

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """q: (n, H, 1, hd) -> (n, H, 1, hd)."""
        lengths = self.slot.length[self.slots]  # (n,)
        if _flash_with_kvcache is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            y = _flash_with_kvcache(q.transpose(1, 2), self.slot.k.transpose(1, 2), self.slot.v.transpose(1, 2),
                                    cache_seqlens=lengths.int(), cache_batch_idx=self.slots.int(), causal=False)
            return y.transpose(1, 2)  # (n, 1, H, hd) -> (n, H, 1, hd)
        k = self.slot.k[:, :, : self.span].index_select(0, self.slots)  # (n, Hkv, span, hd)
        v = self.slot.v[:, :, : self.span].index_select(0, self.slots)  # (n, Hkv, span, hd)
        mask = (torch.arange(self.span, device=q.device) < lengths.unsqueeze(1))[:, None, None, :]  # (n, 1, 1, span)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
