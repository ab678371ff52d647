"""Execution: the model's passes over rows of in-flight tokens, one token per sequence.

    enter(slots, tokens, pos)    embedding + the unshared prefix layers + the routing decision
                                 for recursion 1 (expert-choice router 1; token-choice: every
                                 token's depth, the router kind's ``token_depths``)
    block(slots, depths, pos)    ONE pass of the shared block over rows at any recursion
                                 depths (mixed-depth): the tied weights are the same for every
                                 row, so a layer is one call. Each row's recursion index picks
                                 its KV region (the effective layer start + r * per + j: its own
                                 recursion's entries under recursion-wise caching, recursion
                                 1's under sharing; blocks.py), its relaxation (LoRA / DoRA
                                 adapter and recursion PE of that depth, ``RowRelaxation``) and
                                 its router weight. Then the router of each row's next recursion
                                 decides whether the row continues (expert-choice, causal).
    head(slots, pos)             token-choice gate after the stack, unshared suffix layers,
                                 norm, LM head, greedy argmax (on the device)

Per-row state lives in per-sequence-slot buffers on the device (h, the router weight for the
row's next recursion, token-choice's h1 / depth / weight), gathered and scattered by slot.
Sequence tying runs different unique layers at different depths: such a pass makes one call
per distinct layer (Cycle-family schemes: one call per layer).

Host and device: everything a pass needs from the host (slots, positions, recursion
indices, KV write slots, block tables, lengths) is built by blocks.py before the pass and
copied in one transfer; nothing inside a pass reads the device back. The engine reads back
only what scheduling needs after the pass: the continue / exit decisions of the routed
rows (none for Vanilla, Recursive and token-choice passes, where the host already knows).
With ``pad`` the rows are padded to a few fixed sizes (shapes.py ``row_buckets``), the
padded rows reading and writing the trash block, and block tables to power-of-two widths, so
the device part of a pass (``_enter`` / ``_block`` / ``_head``: tensors in, tensors out) can
be compiled once per shape (``compile``: torch.compile of the device part).

``graphs`` (the engine's default on a GPU): every pass of one shape (kind, row bucket, table
width; the head's also continuation and sampling: ``shapes``) runs over the same static
buffers (``StaticPass``: block tables at the narrowest of ``table_widths`` that holds the
pass's longest row, so attention reads about the rows' context, not ``max_len``; the widest
write plan; the head's enter part over all of the head's rows), captured once as a CUDA graph
on a GPU (graphs.py ``CudaGraphs``, one shared pool) and replayed; ``warmup`` captures every shape
first, largest first, over padding rows only. On a CPU the same path runs eagerly over the
static buffers (tested: equal outputs, the same storage every pass; with a CPU double of the
graph, the state after every pass equals the eager path's).
Sequence tying's block passes (rows split by unique layer) get one fixed-length row-index
vector per unique layer a block layer can be, padded with an extra padding row
(``_tying_static``), so their shape is the row bucket's too.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from mor.engine.blocks import BlockManager
from mor.engine.cache import PagedCache
from mor.engine.graphs import CudaGraphs, StaticPass
from mor.engine.sampling import sample
from mor.engine.shapes import bucket, row_buckets, table_widths
from mor.model.routing import decide, depths_up_front, gate
from mor.model.row_relax import RowRelaxation


class Stepper:
    """The model's passes over rows (see the module docstring)."""

    def __init__(self, model, cache: PagedCache, blocks: BlockManager, max_seqs: int, batch: int, pad: bool = False,
                 compile: bool | str = False, graphs: bool = False, buckets=None):
        if getattr(model, "recursion_attn", None):
            raise ValueError("the engine runs tied attention only: model.recursion_attention='untied' (a q/k/v/o per "
                             "recursion) is served by mor.model.decode")
        self.model, self.cache, self.blocks = model, cache, blocks
        plan = model.plan
        self.nr = len(plan.recursions)
        self.per = len(plan.recursions[0])
        self.start = len(plan.prefix)
        self.suffix_start = self.start + self.nr * self.per
        # the router kind's shape (mor.model.routers.base): depths chosen at entry and one gate
        # after the stack (token-choice), or a router deciding and gating at every recursion
        self.up_front = depths_up_front(model)
        self.per_recursion = bool(model.routers) and not self.up_front
        self.batch, self.pad, self.pad_row = batch, pad or buckets is not None, max_seqs
        w = model.embed_tokens.weight
        self.dev = w.device
        self.buckets = row_buckets(batch, buckets, self.dev, compiled=bool(compile))
        S, C = max_seqs + 1, model.shape.hidden
        self.h = w.new_zeros(S, 1, C)  # (S + 1, 1, C) state of each slot's in-flight token
        self.g = w.new_zeros(S, 1)  # (S + 1, 1) router weight for the token's next recursion
        self.h1 = w.new_zeros(S, 1, C)  # token-choice: state entering the stack
        self.depth = torch.zeros(S, 1, dtype=torch.long, device=self.dev)  # token-choice: depth - 1
        self.tg = w.new_zeros(S, 1)  # token-choice: router weight of the chosen depth
        self.relax = RowRelaxation(model)
        self.launch = lambda: None  # called when a pass's device work starts (the engine's PassClock.launch)
        self.sampling = False  # set per run by the engine: some request samples (else greedy, no sampling ops)
        self.samp = np.zeros((S, 3), dtype=np.int64)  # per slot: temperature, top-p (float64 bits), seed
        self.same_layers = all(len(set(col)) == 1 for col in zip(*plan.recursions))  # Cycle family
        # which recursions a router may drop tokens at (capacity 1 keeps all: the host knows)
        self.drops = (model.router_kind.engine_drops(model.cfg.num_recursions, model.cfg.router) if model.routers
                      else [False] * self.nr)
        # static buffers per row bucket (CUDA graphs on a GPU): padded rows, full-width tables
        if graphs and compile:
            raise ValueError("the engine takes graphs= or compile=, not both")
        self.graphs = bool(graphs)
        self.pad = self.pad or self.graphs
        self.static: dict[tuple, StaticPass] = {}
        self.graph_backend = CudaGraphs(self.dev) if self.graphs and self.dev.type == "cuda" else None
        self.captures = 0  # static shapes captured (on a CPU: first run over new static buffers)
        self.widths = table_widths(blocks.max_blocks)
        self.read = [0, 0]  # the current pass's attention reads: entries gathered, entries of the rows' context
        self.padded = 0  # the current pass's row shape: its rows after padding (EngineResult.padded)
        self.mirror_width = 1 + int(blocks.n_mirrors.max(initial=0))
        # the device part of each pass, optionally compiled (a backend name, or True: inductor)
        self.compiled = bool(compile) or self.graphs
        self._enter_fn, self._block_fn, self._head_fn = self._enter, self._block, self._head
        if compile:
            import torch._dynamo as dynamo

            dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 64)  # one entry per shape bucket
            backend = compile if isinstance(compile, str) else "inductor"
            self._enter_fn, self._block_fn, self._head_fn = (torch.compile(f, backend=backend, dynamic=False)
                                                             for f in (self._enter, self._block, self._head))

    # ------------------------------------------------------------------ host -> device
    def _rows(self, slots: list[int], shape=None) -> tuple[int, int]:
        """(rows, the rows the pass runs at: padded to its bucket, or ``shape``'s)."""
        n = len(slots)
        if shape is not None:
            return n, shape[0]
        return n, (bucket(n, self.batch, self.buckets) if self.pad else n)

    def _upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """One host-to-device copy of several int64 arrays."""
        self.launch()
        flat = np.concatenate([a.reshape(-1).astype(np.int64) for a in arrays])
        t = torch.from_numpy(flat)
        if self.dev.type == "cuda":  # pinned, asynchronous: the host goes on planning
            t = t.pin_memory().to(self.dev, non_blocking=True)
        out, at = [], 0
        for a in arrays:
            out.append(t[at: at + a.size].view(a.shape))
            at += a.size
        return out

    def _plan(self, slots: list[int], layers_per_call: list[list[int]]) -> list[tuple]:
        """Take each call's KV entries (host bookkeeping, blocks.plan_layer): per call
        (write slots (W, n), read columns (n,), lengths (n,))."""
        return [self.blocks.plan_layer(slots, layers) for layers in layers_per_call]

    def _need(self, *plans) -> int:
        """Blocks the longest row of these calls reads (at least 1)."""
        ln = [int(lengths.max()) for p in plans for _, _, lengths in p if lengths.size]
        return max(1, -(-max(ln, default=1) // self.blocks.bs))

    def width(self, need: int) -> int:
        """The table width (blocks) a static pass whose longest row reads ``need`` blocks runs
        at: the narrowest of ``widths`` that holds it."""
        return next(w for w in self.widths if w >= need)

    def _tables(self, plans, slots: list[int], N: int, MB: int | None = None) -> list[np.ndarray]:
        """Per call (write slots (W, N), table (N, MB), lengths (N,)), padded rows on the trash
        block; ``MB`` the width of every call's table (static: the pass's width), else each
        call's own (padded: the next power of two)."""
        bm, n = self.blocks, len(slots)
        out = []
        for writes, cols, lengths in plans:
            W = self.mirror_width if self.graphs else writes.shape[0]  # static: every layer's widest
            w = np.full((W, N), bm.trash * bm.bs, dtype=np.int64)
            w[: writes.shape[0], :n] = np.where(writes >= 0, writes, bm.trash * bm.bs)
            mb = MB
            if mb is None:
                need = self._need([(writes, cols, lengths)])
                mb = min(1 << max(0, math.ceil(math.log2(need))), bm.max_blocks) if self.pad else need
            tab = np.full((N, mb), bm.trash, dtype=np.int64)
            tab[:n] = bm.table[slots, cols, :mb]
            ln = np.ones(N, dtype=np.int64)
            ln[:n] = lengths
            self.read[0] += N * mb * bm.bs
            self.read[1] += int(ln.sum())
            out += [w, tab, ln]
        return out

    def _needs_kv(self, e_rows) -> bool:
        """Whether a call over effective layers e_rows writes any KV (host; compiled passes
        always compute it, padded rows writing the trash block)."""
        return self.compiled or any(self.blocks.specs[e].kind != "shared" for e in e_rows)

    def _layer(self, need_kv: bool, lids, x, pos, rec, w, tab, ln):
        """One layer over the rows: unique layer ``lids`` (one id, or per row), writes w, reads
        (tab, ln). x (N, 1, C)."""
        m = self.model
        tab32, ln32 = tab.to(torch.int32), ln.to(torch.int32)
        ctx = self.relax.at(rec) if rec is not None else contextlib.nullcontext()
        with ctx:
            if isinstance(lids, int):  # the layer writes its keys/values (need_kv) through the view, then attends
                return m.run_layer(lids, x, pos, None, kv=self.cache.view(tab32, ln32, w if need_kv else None))
        # Sequence tying: rows at different depths run different unique layers, one call each;
        # lids is [(unique layer, row indices on the device)], uploaded with the pass's plan
        out = torch.empty_like(x)
        for lid, sel in lids:
            with self.relax.at(rec[sel]):
                out[sel] = m.run_layer(lid, x[sel], pos[sel], None, kv=self.cache.view(tab32[sel], ln32[sel], w[:, sel]))
        return out

    # ------------------------------------------------------------------ passes
    @torch.no_grad()
    def enter(self, slots: list[int], tokens, pos: list[int], shape: tuple[int, int] | None = None) -> torch.Tensor | None:
        """Tokens (n,) (host ints, uploaded with the plan, or long on the device) enter at
        slots: -> keep for recursion 1 (n,) bool on the device, or token-choice's depth - 1
        (n,), or None (every row runs recursion 1). ``shape`` (rows, width): the static
        shape to run at (``warmup``: no rows)."""
        n, N = self._rows(slots, shape)
        self.padded = N
        pre = [[e] * n for e in range(self.start)]
        host = not isinstance(tokens, torch.Tensor)
        arrays = [np.array(slots + [self.pad_row] * (N - n)), np.array(pos + [0] * (N - n))]
        if host:
            arrays.append(np.array(list(tokens) + [0] * (N - n)))
        raw = self._plan(slots, pre)
        if self.graphs and host:
            W = shape[1] if shape else self.width(self._need(raw))
            arrays += self._tables(raw, slots, N, W)
            out = self._static(("enter", N, W), arrays, lambda v: self._enter(v[0], v[1].unsqueeze(1), v[2], tuple(v[3:])))
            return None if out is None else out[:n]
        arrays += self._tables(raw, slots, N)
        dev = self._upload(arrays)
        if host:
            tokens, dev = dev[2], dev[:2] + dev[3:]
        elif N > n:
            tokens = torch.cat([tokens, tokens.new_zeros(N - n)])
        out = self._enter_fn(dev[0], dev[1].unsqueeze(1), tokens, tuple(dev[2:]))
        return None if out is None else out[:n]

    def _static(self, key: tuple, arrays: list[np.ndarray], fn):
        """Run ``fn`` over the static buffers of ``key``'s shape (StaticPass)."""
        self.launch()
        sp = self.static.get(key)
        if sp is None:
            self.captures += 1
            sp = self.static[key] = StaticPass([a.shape for a in arrays], fn, self.dev, self.graph_backend,
                                               state=(self.h, self.g, self.h1, self.depth, self.tg))
        return sp.run(arrays)

    def shapes(self, sampling=(False, True)) -> list[tuple]:
        """Every static pass shape a run can meet, largest first: (kind, rows, width) for enter
        and block passes, (kind, rows, width, continuation, sampling) for head passes."""
        out = []
        for N in self.buckets:
            for W in self.widths:
                out += [("enter", N, W), ("block", N, W)]
                out += [("head", N, W, c, sm) for c in (False, True) for sm in sampling]
        return sorted(out, key=lambda k: (-k[1], -k[2]))

    @torch.no_grad()
    def warmup(self, sampling=(False, True)) -> int:
        """Capture every static pass shape (``shapes``) before any measured request, largest
        first (CUDA graphs on a GPU, sharing one memory pool): each runs once over padding rows
        only, which read and write the trash block and the padding slot, so no sequence's state
        or KV changes. Shapes already captured are skipped. -> the number captured now."""
        if not self.graphs:
            return 0
        before, launch, samp = self.captures, self.launch, self.sampling
        self.launch = lambda: None
        try:
            for key in self.shapes(sampling):
                if key in self.static:
                    continue
                kind, N, W = key[:3]
                if kind == "enter":
                    self.enter([], [], [], shape=(N, W))
                elif kind == "block":
                    self.block([], [], [], shape=(N, W))
                else:
                    self.sampling = key[4]
                    self.head([], [], 0, shape=(N, W), cont=key[3])
        finally:
            self.launch, self.sampling = launch, samp
        return self.captures - before

    def _enter(self, idx, p, tokens, plan):
        """Device part of ``enter``: idx (N,), p (N, 1), tokens (N,), plan (w, tab, ln) per layer."""
        m = self.model
        x = m.embed_tokens(tokens.unsqueeze(1))  # (N, 1, C)
        for j, layer_id in enumerate(m.plan.prefix):
            x = self._layer(True, layer_id, x, p, None, *plan[3 * j: 3 * j + 3])
        self.h[idx] = x
        if self.up_front:
            d = m.router_kind.token_depths(m, x)  # (N, 1) each
            self.h1[idx], self.depth[idx], self.tg[idx] = x, d.depth_id, d.g.to(x.dtype)
            return d.depth_id[:, 0]
        if self.per_recursion:
            d = decide(m, 0, x, torch.ones_like(p, dtype=torch.bool), policy="causal")
            self.g[idx] = d.g.to(x.dtype)
            return d.keep[:, 0] if self.drops[0] else None
        return None

    @torch.no_grad()
    def block(self, slots: list[int], depths: list[int], pos: list[int],
              shape: tuple[int, int] | None = None) -> torch.Tensor | None:
        """One shared-block pass over rows at recursions ``depths`` (0-based, mixed): -> whether
        each row continues to its next recursion, (n,) bool on the device, or None when the
        host knows (no router drops tokens there). ``shape``: as ``enter``'s."""
        m = self.model
        n, N = self._rows(slots, shape)
        self.padded = N
        dpad = depths + [0] * (N - n)
        calls = [[self.start + r * self.per + j for r in depths] for j in range(self.per)]
        arrays = [np.array(slots + [self.pad_row] * (N - n)), np.array(pos + [0] * (N - n)), np.array(dpad),
                  np.array([r + 1 for r in dpad])]
        if not self.same_layers and self.graphs:
            return self._tying_static(slots, depths, pos, calls, n, N, shape)
        raw = self._plan(slots, calls)
        W = (shape[1] if shape else self.width(self._need(raw))) if self.graphs else None
        plan = self._tables(raw, slots, N, W)
        if not self.same_layers:  # the rows of each unique layer, uploaded with the plan
            plan += [g for j in range(self.per) for _, g in self._group_rows(dpad, j)]
        # the routers this pass needs: those of the rows' next recursions (host-known; one that
        # keeps every token still gives the weight that gates its recursion; compiled: all)
        nxt = {r + 1 for r in depths}
        routers = tuple(self.per_recursion and r > 0 and (r in nxt or self.compiled) for r in range(self.nr))
        if self.graphs and self.same_layers:  # one static shape per row bucket (compiled: every router)
            out = self._static(("block", N, W), arrays + plan, lambda v: self._block(
                v[0], v[1].unsqueeze(1), v[2], v[3], tuple(v[4:]), (True,) * self.per, routers))
            return None if out is None else out[:n]
        dev = self._upload(arrays + plan)
        if self.same_layers:
            need = tuple(self._needs_kv(c) for c in calls)
            keep = self._block_fn(dev[0], dev[1].unsqueeze(1), dev[2], dev[3], tuple(dev[4:]), need, routers)
        else:  # Sequence tying: per-row unique layers, one call each (not compiled)
            keep = self._block(dev[0], dev[1].unsqueeze(1), dev[2], dev[3], tuple(dev[4:4 + 3 * self.per]),
                               (True,) * self.per, routers, self._groups(dpad, dev[4 + 3 * self.per:]))
        return None if keep is None else keep[:n]

    def _tying_static(self, slots, depths, pos, calls, n: int, N: int, shape=None):
        """Sequence tying over static buffers: N + 1 rows, the last always a padding row. Every
        unique layer that layer j of the block can be (at any recursion) gets a row-index
        vector of N + 1 entries: its rows, then the last row's index repeated (that row
        writes the trash block and is never read). So the shape is (row bucket) alone; the price: every
        such layer runs over N + 1 rows each pass, also one no row needs."""
        Nt = N + 1
        dpad = depths + [0] * (Nt - n)
        arrays = [np.array(slots + [self.pad_row] * (Nt - n)), np.array(pos + [0] * (Nt - n)), np.array(dpad),
                  np.array([r + 1 for r in dpad])]
        raw = self._plan(slots, calls)
        W = shape[1] if shape else self.width(self._need(raw))
        plan = self._tables(raw, slots, Nt, W)
        groups = [self._static_group_rows(dpad[:N], j, N) for j in range(self.per)]
        plan += [g for gj in groups for _, g in gj]
        routers = tuple(self.per_recursion and r > 0 for r in range(self.nr))
        k = 4 + 3 * self.per

        def fn(v):
            it = iter(v[k:])
            lids = [[(lid, next(it)) for lid, _ in gj] for gj in groups]
            return self._block(v[0], v[1].unsqueeze(1), v[2], v[3], tuple(v[4:k]), (True,) * self.per, routers, lids)

        out = self._static(("block", N, W), arrays + plan, fn)
        return None if out is None else out[:n]

    def _static_group_rows(self, dpad: list[int], j: int, N: int) -> list[tuple[int, np.ndarray]]:
        """Sequence tying, layer j of the block, static: (unique layer, its rows padded to N + 1
        entries with index N) for every unique layer layer j can be."""
        lids = np.array([self.model.plan.recursions[r][j] for r in dpad])
        out = []
        for lid in sorted({rec[j] for rec in self.model.plan.recursions}):
            rows = np.full(N + 1, N, dtype=np.int64)
            sel = np.flatnonzero(lids == lid)
            rows[: sel.size] = sel
            out.append((int(lid), rows))
        return out

    def _group_rows(self, dpad: list[int], j: int) -> list[tuple[int, np.ndarray]]:
        """Sequence tying, layer j of the block: (unique layer, the rows that run it)."""
        lids = np.array([self.model.plan.recursions[r][j] for r in dpad])
        return [(int(lid), np.flatnonzero(lids == lid)) for lid in np.unique(lids)]

    def _groups(self, dpad: list[int], uploaded: list[torch.Tensor]):
        """Per layer j: [(unique layer, row indices on the device)] from the uploaded arrays."""
        it, out = iter(uploaded), []
        for j in range(self.per):
            out.append([(lid, next(it)) for lid, _ in self._group_rows(dpad, j)])
        return out

    def _block(self, idx, p, rec, nxt, plan, need, routers: tuple[bool, ...], lids=None):
        """Device part of ``block``: idx, rec, nxt (N,), p (N, 1), plan (w, tab, ln) per layer;
        ``routers[r]``: run router r (every row's next recursion's router must be among them,
        ``_route``); -> keep (N,), or None where none of them drops tokens (the host knows)."""
        m = self.model
        x0 = self.h[idx]  # (N, 1, C)
        x = x0
        for j in range(self.per):
            lid = m.plan.recursions[0][j] if lids is None else lids[j]
            x = self._layer(need[j], lid, x, p, rec, *plan[3 * j: 3 * j + 3])
        x = self.relax.end_recursion(x, rec)
        if self.per_recursion:
            x = gate(m.cfg.router, x0, x, self.g[idx])  # (N, 1, C)
        self.h[idx] = x
        if not any(routers):
            return None
        keep, self.g[idx] = self._route(x, nxt, self.g[idx], routers)
        return keep[:, 0] if any(r and d for r, d in zip(routers, self.drops)) else None

    def _route(self, x, nxt, g, routers: tuple[bool, ...]):
        """Each row's causal decision and weight for its next recursion ``nxt`` (N,) (Nr: none,
        the row exits; keep False, g as it was): x (N, 1, C), g (N, 1). Each router the pass
        runs decides over every row through ``mor.model.routing.decide``, the one routing rule
        every path calls (a capacity-1 recursion keeps every row and still gives its weight),
        and its decision and weight are kept where it is a row's next."""
        keep = torch.zeros_like(g, dtype=torch.bool)  # (N, 1)
        ones = torch.ones_like(keep)
        for r in range(1, self.nr):
            if routers[r]:
                d = decide(self.model, r, x, ones, policy="causal")
                sel = (nxt == r).unsqueeze(1)  # (N, 1)
                keep = torch.where(sel, d.keep, keep)
                g = torch.where(sel, d.g.to(g.dtype), g)
        return keep, g

    @torch.no_grad()
    def head(self, slots: list[int], pos: list[int], n_cont: int = 0, shape: tuple[int, int] | None = None,
             cont: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Suffix + norm + head on rows whose recursions are done -> greedy tokens (n,) on the
        device; the first ``n_cont`` rows' sequences continue, and their new tokens enter at
        once in the same pass (embedding + prefix + routing, as ``enter``: its output second).
        ``shape`` and ``cont`` (a pass with an enter part, whatever ``n_cont``): ``warmup``'s."""
        n, N = self._rows(slots, shape)
        self.padded = N
        cont = bool(n_cont) if cont is None else cont
        suf = [[self.suffix_start + i] * n for i in range(len(self.model.plan.suffix))]
        arrays = [np.array(slots + [self.pad_row] * (N - n)), np.array(pos + [0] * (N - n))]
        raw = self._plan(slots, suf)
        nc = Nc = 0
        if cont:
            cs = slots[:n_cont]
            nc, Nc = self._rows(cs)
            if self.graphs:
                Nc = N  # static: the enter part spans the head's rows (the rest write the trash block)
            pre = [[e] * nc for e in range(self.start)]
            arrays += [np.array(cs + [self.pad_row] * (Nc - nc)), np.array([q + 1 for q in pos[:nc]] + [0] * (Nc - nc))]
            raw_e = self._plan(cs, pre)
        W = None
        if self.graphs:  # one width for both parts: the static shape's
            W = shape[1] if shape else self.width(self._need(raw, raw_e if cont else []))
        plan = self._tables(raw, slots, N, W)
        plan_e = self._tables(raw_e, cs, Nc, W) if cont else []
        k = len(plan)
        tail = plan_e
        if self.sampling:  # per row: temperature and top-p (float64 bits) and seed, after the plans
            samp = np.zeros((N, 3), dtype=np.int64)
            samp[:n] = self.samp[slots]
            tail = tail + [samp]
        e0 = 2 + 2 * cont

        def fn(v):
            enter = None if not cont else (v[2], v[3].unsqueeze(1), tuple(v[e0 + k: e0 + k + 3 * self.start]))
            return self._head(v[0], v[1].unsqueeze(1), tuple(v[e0: e0 + k]), enter, v[-1] if self.sampling else None)

        if self.graphs:
            tok, out = self._static(("head", N, W, cont, self.sampling), arrays + plan + tail, fn)
        elif self.compiled and not self.graphs:
            dev = self._upload(arrays + plan + tail)
            enter = None if not cont else (dev[2], dev[3].unsqueeze(1), tuple(dev[e0 + k: e0 + k + 3 * self.start]))
            tok, out = self._head_fn(dev[0], dev[1].unsqueeze(1), tuple(dev[e0: e0 + k]), enter,
                                     dev[-1] if self.sampling else None)
        else:
            tok, out = fn(self._upload(arrays + plan + tail))
        return tok[:n], (None if out is None else out[:nc])

    def release(self) -> None:
        """Drop what refers back to this stepper (the static passes' functions and the
        compiled ones close over it), so that it and the KV pool it holds are freed as soon
        as the engine is, not when the garbage collector next runs: a second engine on the
        same GPU asks for the same memory."""
        self.static.clear()
        self._enter_fn = self._block_fn = self._head_fn = None
        self.launch = lambda: None

    def set_sampling(self, slot: int, temperature: float, top_p: float, seed: int) -> None:
        """A sequence slot's sampling parameters (host; uploaded with its head passes)."""
        self.samp[slot] = [np.float64(temperature).view(np.int64), np.float64(top_p).view(np.int64), int(seed)]

    def _head(self, idx, p, plan, enter=None, samp=None):
        """Device part of ``head``; ``enter`` (idx, p, plan) of the continuing rows, the first
        rows of the head's (their tokens are the head's first outputs); ``samp`` (N, 3) the
        rows' sampling parameters (None: greedy)."""
        m = self.model
        x = self.h[idx]  # (N, 1, C)
        if self.up_front:
            x = gate(m.cfg.router, self.h1[idx], x, self.tg[idx], relative=False)  # (N, 1, C)
        for i, layer_id in enumerate(m.plan.suffix):
            x = self._layer(True, layer_id, x, p, None, *plan[3 * i: 3 * i + 3])
        logits = F.linear(m.norm(x[:, 0]), m.lm_head_weight)  # (N, V)
        if samp is None:
            tok = logits.argmax(-1)  # (N,)
        else:
            tok = sample(logits, samp[:, 0].view(torch.float64), samp[:, 1].view(torch.float64), samp[:, 2], p[:, 0])
        if enter is None:
            return tok, None
        idx_c, p_c, plan_c = enter
        return tok, self._enter(idx_c, p_c, tok[: idx_c.shape[0]], plan_c)
