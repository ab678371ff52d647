"""The engine loop: continuous depth-wise batching (App. E) over scheduler, blocks, cache, step.

    engine = Engine(model, batch=32, max_len=512, memory_bytes=80e9)
    result = engine.run([Request(id=0, prompt=[1], max_new_tokens=256), ...])
    result.outputs[0]   # the greedy tokens, equal to decode.generate on that prompt alone

Memory and compute are separate: ``batch`` B is the rows of one pass; the live sequences
are as many as their KV fits. With ``memory_bytes`` the admission limit is
``mor.flops.max_batch`` (App. E's memory model: parameters + capacity-sized KV) and the
paged cache holds what is left after the parameters (blocks.py); otherwise ``max_live`` and
``num_blocks`` say it directly (default: 2B live sequences with room for every token at
every layer).

Each iteration asks the scheduler for the next pass (scheduler.py's policy) and runs it:

    admit   while a slot and the blocks for its prompt are free: the next waiting request
            becomes live; a prompt of T > 1 tokens is prefilled alone (decode.prefill over
            its first T - 1 tokens, copied into blocks), its last token enters (step.enter)
    block   a shared-block pass over up to B rows of any depths (step.block); each row
            continues to its next recursion or exits, as its router says
    head    up to B exited rows run the head (step.head), and in the same pass the next
            tokens of the sequences that continue enter at depth 0; finished sequences give
            back their slots and blocks, and free slots admit waiting requests at once

Before a pass takes cache entries it checks that the blocks are free (blocks.needed); if
not, it preempts the youngest live sequence (its blocks freed, the request back at the
front of the queue with what it generated, recomputed when readmitted) until the pass fits.
A request that cannot fit even alone (every token at every layer) is rejected on its own:
``result.rejected[id]`` says why, the others are served.

``forward_s`` sums the time inside the passes and prefills (synchronised on a GPU), as App.
E times the forward passes; ``wall_s`` is the whole run, scheduling and bookkeeping included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mor.engine.blocks import BlockManager
from mor.engine.cache import FLASH_PAGE, PagedCache, flash_paged
from mor.engine.scheduler import Request, Scheduler, Sequence
from mor.engine.step import Stepper
from mor.model.kv_layout import cache_layout


@dataclass
class EngineResult:
    outputs: dict[int, list[int]]  # request id -> generated token ids (greedy)
    batch: int = 0  # B, rows per pass
    max_live: int = 0  # admission limit (sequences)
    kinds: list[str] = field(default_factory=list)  # per pass: 'enter', 'block' or 'head'
    rows: list[int] = field(default_factory=list)  # per pass: rows run (before padding)
    depth_rows: list[tuple[int, ...]] = field(default_factory=list)  # per block pass: rows at each recursion
    waiting: list[int] = field(default_factory=list)  # per pass: requests in the queue
    live: list[int] = field(default_factory=list)  # per pass: live sequences
    blocks: list[int] = field(default_factory=list)  # per pass: KV blocks in use after it
    admitted: list[int] = field(default_factory=list)  # request ids in the order they went live
    preempted: list[int] = field(default_factory=list)  # request ids, each time one was preempted
    rejected: dict[int, str] = field(default_factory=dict)  # request id -> why it can never run
    peak_blocks: int = 0
    forward_s: float = 0.0  # time inside the passes and prefills (synchronised on a GPU)
    wall_s: float = 0.0  # whole run

    @property
    def tokens(self) -> int:
        return sum(len(v) for v in self.outputs.values())

    @property
    def steps(self) -> int:
        return len(self.kinds)

    @property
    def block_passes(self) -> int:
        return self.kinds.count("block")

    def recursion_tokens(self) -> list[int]:
        """Tokens that ran each recursion."""
        return [sum(col) for col in zip(*self.depth_rows)] if self.depth_rows else []

    def passes_per_token(self) -> float:
        """Shared-block passes per generated token (Σ capacities / B when every pass is full)."""
        return self.block_passes / max(1, self.tokens)

    def row_fill(self, while_waiting: bool = False) -> float:
        """Mean rows per shared-block pass as a fraction of B (only while the queue is non-empty)."""
        fills = [n / self.batch for k, n, w in zip(self.kinds, self.rows, self.waiting)
                 if k == "block" and (w > 0 or not while_waiting)]
        return sum(fills) / len(fills) if fills else 0.0

    def mixed_passes(self) -> int:
        """Shared-block passes whose rows came from two or more recursion depths."""
        return sum(sum(n > 0 for n in d) >= 2 for d in self.depth_rows)

    # the lockstep engine's per-stage view (mor.engine.job reads it): each block pass split
    # into its depths, 'depth<r>' with the rows that ran recursion r
    @property
    def stages(self) -> list[str]:
        return [s for s, _ in self._stage_rows()]

    @property
    def ran(self) -> list[int]:
        return [n for _, n in self._stage_rows()]

    def _stage_rows(self) -> list[tuple[str, int]]:
        out, d = [], iter(self.depth_rows)
        for kind, n in zip(self.kinds, self.rows):
            if kind == "block":
                out += [(f"depth{r}", c) for r, c in enumerate(next(d)) if c]
            elif kind == "head":
                out.append(("head", n))
        return out

    @property
    def occupancy(self) -> list[float]:
        """Per pass: live sequences as a fraction of the admission limit."""
        return [n / self.max_live for n in self.live]


class Engine:
    """Greedy continuous depth-wise batching of ``model`` (see the module docstring).

    batch       rows per pass (B; ``capacity`` is its old name)
    max_len     tokens per sequence (prompt + generated)
    memory_bytes  parameters + KV budget: admission limit flops.max_batch, blocks the rest
    max_live, num_blocks  set the admission limit and the pool directly instead
    block_size  entries per KV block (flash-attn's paged kernel needs a multiple of 256)
    policy      'depthwise' (App. E) or 'lockstep' (one depth per pass; the benchmark's old policy)
    pad         pad rows to fixed sizes (default: on a GPU)
    compile     torch.compile the device part of each pass (True: inductor, or a backend name);
                with ``pad`` a pass compiles once per row bucket and block-table width
    """

    def __init__(self, model, batch: int | None = None, max_len: int = 512, device=None, dtype=None, *,
                 capacity: int | None = None, memory_bytes: float | None = None, max_live: int | None = None,
                 num_blocks: int | None = None, block_size: int | None = None, policy: str = "depthwise",
                 pad: bool | None = None, compile: bool | str = False):
        from mor.flops import max_batch, model_bytes

        batch = batch if batch is not None else capacity
        if batch is None or batch < 1:
            raise ValueError(f"engine batch must be >= 1, got {batch}")
        w = model.embed_tokens.weight
        self.device = torch.device(device) if device is not None else w.device
        self.dtype = dtype or w.dtype
        if model.cfg.relaxation == "prefix":
            raise NotImplementedError("the engine does not support the prefix relaxation (its keys are not paged)")
        if max_len > model.shape.max_seq_len:
            raise ValueError(f"max_len={max_len} exceeds the model's max_seq_len {model.shape.max_seq_len}")
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.batch, self.max_len, self.policy = batch, max_len, policy
        self.specs = cache_layout(model.cfg, model.plan, model.kv_producers, max_len, "full")
        bs = block_size or (FLASH_PAGE if flash_paged(self.device) else 16)
        elem = torch.tensor([], dtype=self.dtype).element_size()
        n_store = sum(s.kind != "shared" for s in self.specs)
        block_bytes = 2 * bs * model.shape.kv_heads * model.shape.head_dim * elem
        if memory_bytes is not None:  # App. E's memory model is the admission limit
            max_live = max_batch(model.cfg, model.shape, model.vocab_size, max_len, memory_bytes, elem)
            free = memory_bytes - model_bytes(model.cfg, model.shape, model.vocab_size, elem)
            num_blocks = int(free // block_bytes)
            if max_live < 1 or num_blocks < 1:
                raise ValueError(f"{memory_bytes / 2**30:.3f} GiB hold the parameters but no sequence's KV")
        max_live = max_live or (batch if policy == "lockstep" else 2 * batch)
        num_blocks = num_blocks or max_live * n_store * -(-max_len // bs)
        self.max_live = max_live
        self.blocks = BlockManager(self.specs, num_blocks, bs, max_live, max_len)
        self.cache = PagedCache(num_blocks, bs, model.shape.kv_heads, model.shape.head_dim, self.dtype, self.device)
        self.stepper = Stepper(self.model, self.cache, self.blocks, max_live, batch,
                               pad=self.device.type == "cuda" if pad is None else pad, compile=compile)
        nr, per, start = self.stepper.nr, self.stepper.per, self.stepper.start
        col = self.blocks.col

        def writes(layers) -> list[int]:  # storing columns a token running these layers appends to
            out = []
            for e in layers:
                if self.specs[e].kind == "own":
                    out += [int(col[e]), *self.blocks.mirrors.get(e, ())]
            return out

        self.write_cols = {("block", r): writes(range(start + r * per, start + (r + 1) * per)) for r in range(nr)}
        self.write_cols["enter"] = writes(range(start))
        self.write_cols["head"] = writes(range(start + nr * per, len(self.specs)))
        self.write_cols["head", "enter"] = self.write_cols["head"] + self.write_cols["enter"]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ run
    def run(self, requests: list[Request], on_finish=None) -> EngineResult:
        """Serve ``requests``; ``on_finish(request_id, slot)`` (tests) runs as a sequence
        finishes, before its blocks are freed (``sequence_kv(slot)`` reads them)."""
        with torch.no_grad(), self.stepper.relax.installed():
            return self._run(requests, on_finish)

    def sequence_kv(self, slot: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The keys and values a live sequence holds, per storing effective layer e:
        (n_e, Hkv, hd) each, in entry (position) order."""
        bm, out = self.blocks, {}
        k = self.cache.k.view(-1, *self.cache.k.shape[2:])
        v = self.cache.v.view(-1, *self.cache.v.shape[2:])
        for e in bm.store:
            c = int(bm.col[e])
            n = int(bm.length[slot, c])
            entries = torch.arange(n)
            flat = torch.from_numpy(bm.table[slot, c][entries.numpy() // bm.bs].astype("int64")) * bm.bs + entries % bm.bs
            out[e] = k[flat.to(k.device)], v[flat.to(v.device)]
        return out

    def _run(self, requests: list[Request], on_finish) -> EngineResult:
        t_run = time.perf_counter()
        ids = [r.id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique")
        for r in requests:
            if not r.prompt:
                raise ValueError(f"request {r.id}: empty prompt (give at least one token, e.g. BOS)")
            if len(r.prompt) + r.max_new_tokens - 1 > self.max_len:
                raise ValueError(f"request {r.id}: prompt {len(r.prompt)} + {r.max_new_tokens} new tokens exceeds "
                                 f"the engine's max_len {self.max_len}")
        bm, st = self.blocks, self.stepper
        sched = Scheduler(self.batch, self.max_live, st.nr, self.policy)
        res = EngineResult({}, self.batch, sched.max_live)
        for r in requests:
            need = bm.worst_case(len(r.prompt) + r.max_new_tokens - 1)
            if r.max_new_tokens < 1:
                res.outputs[r.id] = []
            elif need > bm.num_blocks:
                res.rejected[r.id] = (f"request {r.id}: {len(r.prompt)} prompt + {r.max_new_tokens} new tokens need up "
                                      f"to {need} KV blocks of {bm.bs} entries, the cache has {bm.num_blocks}; "
                                      f"give the engine more memory or shorten the request")
            else:
                sched.waiting.append(r)
        log: list[tuple[torch.Tensor, list[int]]] = []  # per head pass: tokens (n,) on the device, request ids
        partial: dict[int, list[int]] = {}  # request id -> tokens generated before preemption(s)
        fwd = 0.0

        def timed(fn, *args):
            nonlocal fwd
            self._sync()
            t = time.perf_counter()
            out = fn(*args)
            self._sync()
            fwd += time.perf_counter() - t
            return out

        def record(kind: str, n: int, depth_rows=None) -> None:
            res.kinds.append(kind)
            res.rows.append(n)
            res.waiting.append(len(sched.waiting))
            res.live.append(len(sched.running))
            res.blocks.append(bm.used)
            if depth_rows is not None:
                res.depth_rows.append(depth_rows)

        def generated_tokens() -> dict[int, list[int]]:
            out: dict[int, list[int]] = {}
            if log:
                flat = torch.cat([t for t, _ in log]).tolist()
                rids = [i for _, ids in log for i in ids]
                for i, t in zip(rids, flat):
                    out.setdefault(i, []).append(t)
            return out

        def preempt(rows: list[int]) -> None:
            """Free the youngest live sequence; it resumes from the front of the queue, its
            prompt extended by what it generated (recomputed when readmitted)."""
            victim = sched.youngest()
            req = victim.request
            mine = generated_tokens().get(req.id, [])  # since its last admission (older ones: partial)
            partial[req.id] = partial.get(req.id, []) + mine
            _forget(req.id)
            sched.drop(victim)
            bm.release(victim.slot)
            if victim.slot in rows:
                rows.remove(victim.slot)
            sched.waiting.appendleft(Request(req.id, req.prompt + mine, req.max_new_tokens - len(mine)))
            res.preempted.append(req.id)

        def _forget(rid: int) -> None:
            """Drop a request's tokens from the log (they now live in ``partial``)."""
            keep = []
            for t, ids in log:
                sel = [i for i, x in enumerate(ids) if x != rid]
                if len(sel) != len(ids):
                    t, ids = t[torch.tensor(sel, dtype=torch.long, device=t.device)], [ids[i] for i in sel]
                if ids:
                    keep.append((t, ids))
            log[:] = keep

        def ensure(stage_of: dict[int, object]) -> None:
            """Preempt until the blocks that rows {slot: stage} append are free."""
            while True:
                need = bm.needed([(s, self.write_cols[k]) for s, k in stage_of.items()])
                if need <= len(bm.free):
                    return
                if len(sched.running) <= 1:
                    raise RuntimeError("a lone sequence does not fit the KV cache; this request should have been rejected")
                rows = list(stage_of)
                preempt(rows)
                for s in list(stage_of):
                    if s not in rows:
                        del stage_of[s]

        def route_entered(seqs: list[Sequence], out) -> None:
            """After enter: depth 0, or straight to the head if router 1 dropped the token."""
            if out is None:
                for q in seqs:
                    sched.depth[0].append(q.slot)
                return
            vals = out.tolist()  # one read-back: router 1's decision or token-choice's depths
            for q, v in zip(seqs, vals):
                if st.token_choice:
                    q.exit_depth = int(v) + 1
                    sched.depth[0].append(q.slot)
                elif v:
                    sched.depth[0].append(q.slot)
                else:
                    sched.exited.append(q.slot)

        def admit() -> list[Sequence]:
            from mor.model.decode import prefill

            new: list[Sequence] = []
            while sched.can_admit():
                req = sched.waiting[0]
                if bm.worst_case(len(req.prompt)) > len(bm.free):
                    break  # wait for blocks
                seq = sched.admit()
                res.admitted.append(req.id)
                if len(req.prompt) > 1:  # prefill all but the last prompt token, copy into blocks
                    prompt = torch.tensor([req.prompt[:-1]], device=self.device)  # (1, T - 1)
                    pre, _ = timed(prefill, self.model, prompt, len(req.prompt) - 1)
                    for e, slot in pre.slots.items():
                        if pre.specs[e].kind == "dagger":
                            slot.mirror(pre.slots[pre.specs[e].source])
                        n = int(slot.length[0])
                        if n:
                            flat = torch.from_numpy(bm.fill(seq.slot, int(bm.col[e]), n)).to(self.device)
                            self.cache.k.view(-1, *self.cache.k.shape[2:]).index_copy_(0, flat, slot.k[0, :, :n].transpose(0, 1))
                            self.cache.v.view(-1, *self.cache.v.shape[2:]).index_copy_(0, flat, slot.v[0, :, :n].transpose(0, 1))
                new.append(seq)
            return new

        def enter(seqs: list[Sequence], dev_tokens: torch.Tensor | None) -> None:
            """Enter the in-flight tokens of seqs (the first len(dev_tokens) given on the device,
            the rest from their prompts), B rows per pass."""
            if not seqs:
                return
            stage = {q.slot: "enter" for q in seqs}
            ensure(stage)
            n_dev = 0 if dev_tokens is None else dev_tokens.shape[0]
            kept = [i for i, q in enumerate(seqs) if q.slot in stage]
            host = [seqs[i].request.prompt[-1] for i in kept if i >= n_dev]
            parts = []
            if n_dev:
                k_dev = [i for i in kept if i < n_dev]
                parts.append(dev_tokens[: len(k_dev)] if k_dev == list(range(len(k_dev)))
                             else dev_tokens[torch.tensor(k_dev, dtype=torch.long, device=dev_tokens.device)])
            if host:
                parts.append(torch.tensor(host, device=self.device))
            seqs = [seqs[i] for i in kept]
            if not seqs:
                return
            toks = torch.cat(parts) if len(parts) > 1 else parts[0]
            for i in range(0, len(seqs), self.batch):
                chunk = seqs[i: i + self.batch]
                out = timed(st.enter, [q.slot for q in chunk], toks[i: i + self.batch], [q.position for q in chunk])
                record("enter", len(chunk))
                route_entered(chunk, out)

        enter(admit(), None)
        while (nxt := sched.next_pass()) is not None:
            kind, rows = nxt
            if kind == "block":
                stage = {s: ("block", r) for s, r in rows}
                ensure(stage)
                rows = [(s, r) for s, r in rows if s in stage]
                if not rows:
                    continue
                slots, depths = [s for s, _ in rows], [r for _, r in rows]
                keep = timed(st.block, slots, depths, [sched.running[s].position for s in slots])
                counts = [0] * st.nr
                for r in depths:
                    counts[r] += 1
                record("block", len(rows), tuple(counts))
                keep = keep.tolist() if keep is not None else None  # the pass's one read-back
                for i, (s, r) in enumerate(rows):
                    q = sched.running[s]
                    last = q.exit_depth if q.exit_depth is not None else st.nr
                    go = r + 1 < last and (keep is None or keep[i])
                    (sched.depth[r + 1] if go else sched.exited).append(s)
                continue
            # head: continuing sequences first; their next tokens enter in the same pass
            seqs = [sched.running[s] for s in rows]
            seqs.sort(key=lambda q: q.remaining <= 1)
            stage = {q.slot: ("head", "enter") if q.remaining > 1 else "head" for q in seqs}
            ensure(stage)
            seqs = [q for q in seqs if q.slot in stage]
            if not seqs:
                continue
            n_cont = sum(q.remaining > 1 for q in seqs)
            tok, out = timed(st.head, [q.slot for q in seqs], [q.position for q in seqs], n_cont)
            record("head", len(seqs))
            log.append((tok, [q.request.id for q in seqs]))
            for q in seqs:
                q.generated += 1
                if q.remaining == 0:
                    if on_finish is not None:
                        on_finish(q.request.id, q.slot)
                    sched.finish(q)
                    bm.release(q.slot)
            route_entered(seqs[:n_cont], out)
            enter(admit(), None)  # freed slots take waiting requests at once
        toks = generated_tokens()
        for r in requests:
            if r.id not in res.outputs and r.id not in res.rejected:
                res.outputs[r.id] = partial.get(r.id, []) + toks.get(r.id, [])
        res.peak_blocks = bm.peak
        res.forward_s = fwd
        res.wall_s = time.perf_counter() - t_run
        return res
