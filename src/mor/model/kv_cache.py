"""The static-size inference KV cache that decoding fills, under the KV strategies that
``mor.model.kv_sharing`` applies in training (recursion-wise caching, recursive sharing and
its dagger variant; who produces a layer's KV is ``tying.kv_producers``).

Inference cache shape contract (``KVCache``), one ``KVSlot`` per effective layer e that
stores KV (``cache.specs[e].kind`` 'own' or 'dagger'; 'shared' layers store nothing and
read their producer's slot):

    k, v    (B, Hkv, S_e, hd)  preallocated once (static shapes, App. E: torch.compile);
                               keys already rotated by RoPE at their original position
    pos     (B, S_e) long      original position of each filled entry, ascending; EMPTY
                               (int64 max) past the row's length
    length  (B,) long          filled entries per sequence. Recursion-wise MoR slots differ
                               per sequence: only the tokens that reached the recursion
                               were written.

    S_e = max_len ('full' sizing), or the recursion's design share of max_len ('capacity'
    sizing: the memory the paper's cost table counts; a router that keeps more tokens than
    that fails loudly instead of overwriting). The layout is ``kv_layout.cache_layout``,
    the same definition mor.flops counts memory with.

Attention over a slot always spans all S_e entries with a boolean mask
``pos <= query position`` (unfilled entries hold EMPTY, so they never pass), so the
attention shapes never change while decoding (writes index the filled entries, which
needs one host sync per layer: a compiled decoder would move them to a fixed-shape scatter). A 'dagger' slot mirrors its producer's entries and overwrites the entries
of the tokens that reached its recursion with fresh KV.

Misuse fails loudly: decoding without a cache, a cache built for another model, a wrong
batch size, or running past ``max_len``.
"""

from __future__ import annotations

import torch

from mor.model.kv_layout import SlotKind, SlotSpec, cache_layout, recursion_of  # noqa: F401 (re-exported)

EMPTY = torch.iinfo(torch.long).max  # position of an unfilled cache entry: never <= a query


# --------------------------------------------------------------------------------------
# Static-size cache
# --------------------------------------------------------------------------------------
class KVSlot:
    """Keys/values of one effective layer for B sequences (shapes: module docstring)."""

    def __init__(self, name: str, batch: int, kv_heads: int, size: int, head_dim: int, dtype, device):
        self.name = name
        self.k = torch.zeros(batch, kv_heads, size, head_dim, dtype=dtype, device=device)  # (B, Hkv, S, hd)
        self.v = torch.zeros_like(self.k)  # (B, Hkv, S, hd)
        self.pos = torch.full((batch, size), EMPTY, dtype=torch.long, device=device)  # (B, S)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)

    @property
    def size(self) -> int:
        return self.k.shape[2]

    def nbytes(self) -> int:
        """Bytes of keys and values (the position bookkeeping is not counted)."""
        return self.k.numel() * self.k.element_size() * 2

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> None:
        """Write the valid tokens, in order, after each row's last entry.

        k, v: (B, Hkv, n, hd); pos, valid: (B, n). Tokens arrive in position order, so each
        row's entries stay sorted by position.
        """
        new_len = self.length + valid.sum(1)  # (B,)
        if bool((new_len > self.size).any()):
            raise RuntimeError(
                f"KV cache slot {self.name} is full: {int(new_len.max())} tokens routed to it, room for "
                f"{self.size}. The router kept more tokens than a 'capacity'-sized cache holds, or the "
                f"sequence outgrew max_len; use init_cache(..., sizing='full') or a larger max_len"
            )
        dest = self.length.unsqueeze(1) + valid.long().cumsum(1) - 1  # (B, n) entry of each valid token
        b, t = valid.nonzero(as_tuple=True)  # (N,), (N,)
        d = dest[b, t]  # (N,)
        self.k[b, :, d] = k[b, :, t]  # (N, Hkv, hd)
        self.v[b, :, d] = v[b, :, t]
        self.pos[b, d] = pos[b, t]
        self.length = new_len

    def mirror(self, src: "KVSlot") -> None:
        """Dagger: copy the producer's entries this slot has not seen yet (same layout)."""
        new = torch.arange(self.size, device=self.k.device) >= self.length.unsqueeze(1)  # (B, S)
        self.k = torch.where(new[:, None, :, None], src.k, self.k)  # (B, Hkv, S, hd)
        self.v = torch.where(new[:, None, :, None], src.v, self.v)
        self.pos = src.pos.clone()
        self.length = src.length.clone()

    def overwrite(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> None:
        """Dagger: replace the entries of the valid tokens (found by position) with fresh KV."""
        entry = torch.searchsorted(self.pos, pos.contiguous())  # (B, n)
        b, t = valid.nonzero(as_tuple=True)  # (N,), (N,)
        d = entry[b, t]  # (N,)
        if bool((d >= self.size).any()) or bool((self.pos[b, d.clamp(max=self.size - 1)] != pos[b, t]).any()):
            raise RuntimeError(f"KV cache slot {self.name}: a token to refresh has no entry in its producer's slot")
        self.k[b, :, d] = k[b, :, t]  # (N, Hkv, hd)
        self.v[b, :, d] = v[b, :, t]

    def mask(self, q_pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(B, 1, Tq, S) bool: filled entries at positions <= the query's. A padded query row
        (valid False) sees every entry so it never softmaxes over nothing (its output is
        discarded)."""
        m = self.pos.unsqueeze(1) <= q_pos.unsqueeze(2)  # (B, Tq, S)
        return (m | ~valid.unsqueeze(2)).unsqueeze(1)  # (B, 1, Tq, S)


class KVCache:
    """The KV cache of one model for ``batch`` sequences of up to ``max_len`` tokens.

    ``seen``: tokens consumed per sequence (all sequences advance together; ragged prompts
    are not supported). ``depth`` (B, max_len): recursions each consumed token reached
    (-1: not consumed yet, or not computed because nothing downstream needed it).
    """

    def __init__(self, specs: list[SlotSpec], batch: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype, device, owner: int):
        if batch < 1 or max_len < 1:
            raise ValueError(f"KV cache needs batch >= 1 and max_len >= 1, got batch={batch}, max_len={max_len}")
        self.specs, self.batch, self.max_len, self.owner = specs, batch, max_len, owner
        self.slots = {
            e: KVSlot(f"e{e}", batch, kv_heads, s.size, head_dim, dtype, device)
            for e, s in enumerate(specs)
            if s.kind != "shared"
        }
        self.seen = 0
        self.depth = torch.full((batch, max_len), -1, dtype=torch.long, device=device)  # (B, max_len)
        # layers after the last one that writes a slot only matter for the logits they give
        self.last_writer = max(self.slots, default=-1)

    def slot(self, e: int) -> KVSlot:
        """The slot effective layer e attends over (its producer's for a 'shared' layer)."""
        spec = self.specs[e]
        return self.slots[spec.source if spec.kind == "shared" else e]

    def nbytes(self) -> int:
        """Bytes of all preallocated keys and values."""
        return sum(s.nbytes() for s in self.slots.values())

    def check(self, model, batch: int, new_tokens: int) -> None:
        """Fail loudly on misuse before anything is written."""
        if self.owner != id(model):
            raise RuntimeError("this KV cache was built for another model; call init_cache(model, ...) for this one")
        if batch != self.batch:
            raise ValueError(f"batch size {batch} does not match the KV cache's batch size {self.batch}")
        if self.seen + new_tokens > self.max_len:
            raise ValueError(
                f"the KV cache holds at most max_len={self.max_len} tokens per sequence; it has {self.seen} "
                f"and got {new_tokens} more. Allocate a larger one with init_cache(model, batch, max_len=...)"
            )
