"""Execution: the model step on a group of in-flight tokens, one token per sequence.

Three stages, each a batch of rows (n tokens of n different sequences, (n, 1, C)):

    enter(ids)       embedding + the unshared prefix layers (+ token-choice: the depth
                     decision, routing.token_depths); the rows then wait at depth 0
    recursion(r)     routing.decide (causal) on the rows at depth r: the kept rows run
                     recursion r's shared layers together and are gated (routing.gate);
                     the rest exit. Kept rows wait at depth r + 1 (or exit after the last)
    leave()          token-choice gate after the stack, the unshared suffix layers, norm,
                     LM head, greedy argmax

Every row carries its own slot, position and cache lengths (``Rows``); attention reads the
row's slot in the static cache (cache.py). This is decode.py's cached path with rows of
different sequences at different positions instead of one shared position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mor.engine.cache import SlotCache
from mor.model.routing import TokenDepths, decide, gate, is_token_choice, token_depths


@dataclass
class Rows:
    """In-flight tokens: seq (n) slot ids (host), slots (n,) and pos (n, 1) on the device,
    h (n, 1, C) state, depths (token-choice: h1, depth_id, g per row)."""

    seq: list[int]
    pos_host: list[int]
    slots: torch.Tensor
    pos: torch.Tensor
    h: torch.Tensor
    depths: TokenDepths | None = None

    def __len__(self) -> int:
        return len(self.seq)

    def take(self, idx: list[int]) -> "Rows":
        """Rows idx (host list), in that order."""
        i = torch.tensor(idx, device=self.h.device)
        d = self.depths
        sub = None if d is None else TokenDepths(d.h1[i], d.depth_id[i], d.g[i])
        return Rows([self.seq[j] for j in idx], [self.pos_host[j] for j in idx], self.slots[i], self.pos[i], self.h[i], sub)

    @staticmethod
    def cat(chunks: list["Rows"]) -> "Rows":
        if len(chunks) == 1:
            return chunks[0]
        d = [c.depths for c in chunks]
        depths = None if d[0] is None else TokenDepths(torch.cat([x.h1 for x in d]), torch.cat([x.depth_id for x in d]),
                                                       torch.cat([x.g for x in d]))
        return Rows(sum((c.seq for c in chunks), []), sum((c.pos_host for c in chunks), []),
                    torch.cat([c.slots for c in chunks]), torch.cat([c.pos for c in chunks]),
                    torch.cat([c.h for c in chunks]), depths)


class Stepper:
    """The model's three stages over rows, on a ``SlotCache``."""

    def __init__(self, model, cache: SlotCache):
        self.model, self.cache = model, cache
        plan = model.plan
        self.per = len(plan.recursions[0]) if plan.recursions else 0
        self.start = len(plan.prefix)  # effective index of recursion 1's first layer
        self.suffix_start = len(plan.order) - len(plan.suffix)
        self.token_choice = is_token_choice(model)

    def _layer(self, e: int, layer_id: int, x: torch.Tensor, rows: Rows, recursion) -> torch.Tensor:
        """Effective layer e on x (n, 1, C): write its KV (own / dagger), attend over the row's slot."""
        m = self.model
        if self.cache.specs[e].kind != "shared":
            k, v = m.layer_kv(layer_id, x, rows.pos, recursion)  # (n, Hkv, 1, hd) each
            self.cache.write(e, rows.slots, k, v, rows.pos)
        kv = self.cache.view(e, rows.slots, max(rows.pos_host) + 1)
        return m.run_layer(layer_id, x, rows.pos, recursion, kv=kv)  # (n, 1, C)

    @torch.no_grad()
    def enter(self, seq: list[int], ids: list[int], pos: list[int]) -> Rows:
        m = self.model
        dev = m.embed_tokens.weight.device
        slots = torch.tensor(seq, device=dev)  # (n,)
        p = torch.tensor(pos, device=dev).unsqueeze(1)  # (n, 1)
        h = m.embed_tokens(torch.tensor(ids, device=dev).unsqueeze(1))  # (n, 1, C)
        rows = Rows(list(seq), list(pos), slots, p, h)
        for e, layer_id in enumerate(m.plan.prefix):
            rows.h = self._layer(e, layer_id, rows.h, rows, None)
        if self.token_choice:
            rows.depths = token_depths(m, rows.h)  # (n, 1) depth and gate per row
        return rows

    @torch.no_grad()
    def recursion(self, r: int, rows: Rows) -> tuple[Rows | None, Rows | None]:
        """Run recursion r on the rows that continue -> (continuing rows, exiting rows)."""
        m = self.model
        g = None
        if m.routers:
            active = torch.ones(len(rows), 1, dtype=torch.bool, device=rows.h.device)  # (n, 1)
            d = decide(m, r, rows.h, active, policy="causal", depths=rows.depths)
            keep, g = d.keep[:, 0].tolist(), d.g  # host decision (one sync); g (n, 1) or None
            run = [i for i, k in enumerate(keep) if k]
            if len(run) < len(rows):
                out = [i for i, k in enumerate(keep) if not k]
                stay = rows.take(out)
                if not run:
                    return None, stay
                idx = torch.tensor(run, device=rows.h.device)
                g = None if g is None else g[idx]
                rows = rows.take(run)
            else:
                stay = None
        else:
            stay = None
        x0 = rows.h
        x = x0
        e = self.start + r * self.per
        for j, layer_id in enumerate(m.plan.recursions[r]):
            x = self._layer(e + j, layer_id, x, rows, r)  # (n, 1, C)
        x = m.end_recursion(r, x)
        rows.h = gate(m.cfg.router.gating, x0, x, g) if m.routers else x  # (n, 1, C)
        return rows, stay

    @torch.no_grad()
    def leave(self, rows: Rows) -> list[int]:
        """Suffix layers + norm + head on rows -> the greedy next token of each row."""
        m = self.model
        h = rows.h
        if rows.depths is not None:
            h = gate(m.cfg.router.gating, rows.depths.h1, h, rows.depths.g, relative=False)  # (n, 1, C)
        for i, layer_id in enumerate(m.plan.suffix):
            h = self._layer(self.suffix_start + i, layer_id, h, rows, None)
        logits = F.linear(m.norm(h[:, 0]), m.lm_head_weight)  # (n, V)
        return logits.argmax(-1).tolist()
