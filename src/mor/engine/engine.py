"""The engine loop: continuous depth-wise batching (App. E), nano-vllm's schedule -> run ->
postprocess over scheduler.py, blocks.py, cache.py, step.py (docs/engine.md).

    engine = Engine(model, batch=32, max_len=512, memory_bytes=80e9)   # options.EngineOptions' fields
    result = engine.run([Request(id=0, prompt=[1], max_new_tokens=256), ...])
    result.outputs[0]   # the greedy tokens, equal to decode.generate on that prompt alone

Memory and compute are separate: ``batch`` B is the rows of one pass; the live sequences
are as many as their KV fits. With ``memory_bytes`` the admission limit is
``mor.flops.max_batch`` counted in whole paged blocks (``block_size=``: the quantity the
block manager allocates, so admitting that many never overruns the pool while the routers
keep their design shares) and the paged cache holds what is left after the parameters;
otherwise ``max_live`` and ``num_blocks`` say it directly (default: 2B live sequences with
room for every token at every layer).

``Engine._run`` asks the scheduler for the next pass (prefill of up to B new prompts
together, enter, a mixed-depth shared-block pass, or a head pass whose continuing rows'
next tokens enter at once), launches it, and only then applies the previous pass's results
(routing decisions and tokens, read back through ``Readback``), so the host plans while the
device runs; the scheduler answers WAIT when it needs those results first. Preemption
(the youngest live sequence, recomputed when readmitted) keeps a pass within the free
blocks; a request that cannot fit even alone is rejected on its own
(``result.rejected[id]`` says why).

``pass_s`` holds the time inside each pass (CUDA events on a GPU, read when the run ends),
``forward_s`` their sum (App. E's timing), ``wall_s`` the whole run; ``window()`` gives
every figure over one steady-state window (result.py; the clock and read-back: clock.py).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from mor.engine.blocks import BlockManager
from mor.engine.cache import FLASH_PAGE, PagedCache, attention_backend, flash_paged, kv_bytes
from mor.engine.clock import PassClock, Readback
from mor.engine.options import EngineOptions
from mor.engine.result import EngineResult
from mor.engine.scheduler import WAIT, Pass, Scheduler
from mor.engine.sequence import Request, Sequence
from mor.engine.step import Stepper
from mor.model.kv_layout import cache_layout

__all__ = ["Engine", "EngineOptions", "EngineResult", "PassClock", "Readback"]


class Engine:
    """Greedy continuous depth-wise batching of ``model`` (see the module docstring): its
    options an ``EngineOptions`` (options.py), or its fields as keywords, or both (the
    keywords replace the object's fields); ``device`` and ``dtype`` default to the model's."""

    def __init__(self, model, options: EngineOptions | None = None, *, device=None, dtype=None, **fields):
        from mor.flops import max_batch, model_bytes

        o = dataclasses.replace(options, **fields) if options is not None else EngineOptions(**fields)
        self.options = o
        batch, max_len, policy = o.batch, o.max_len, o.policy
        memory_bytes, max_live, num_blocks, block_size = o.memory_bytes, o.max_live, o.num_blocks, o.block_size
        pad, compile, graphs = o.pad, o.compile, o.graphs
        w = model.embed_tokens.weight
        self.device = torch.device(device) if device is not None else w.device
        self.dtype = dtype or w.dtype
        if model.cfg.relaxation == "prefix":
            raise NotImplementedError("the engine does not support the prefix relaxation (its keys are not paged)")
        if max_len > model.shape.max_seq_len:
            raise ValueError(f"max_len={max_len} exceeds the model's max_seq_len {model.shape.max_seq_len}")
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.batch, self.max_len, self.policy, self.auto_warmup = batch, max_len, policy, o.warmup
        self.specs = cache_layout(model.cfg, model.plan, model.kv_producers, max_len, "full")
        bs = block_size or (FLASH_PAGE if flash_paged(self.device) else 16)
        elem = torch.tensor([], dtype=self.dtype).element_size()
        n_store = sum(s.kind != "shared" for s in self.specs)
        block_bytes = 2 * bs * model.shape.kv_heads * model.shape.head_dim * elem
        if memory_bytes is not None:  # App. E's memory model is the admission limit
            # the same quantity the block manager allocates: whole blocks per sequence and layer
            max_live = max_batch(model.cfg, model.shape, model.vocab_size, max_len, memory_bytes, elem, block_size=bs,
                                 layout=cache_layout(model.cfg, model.plan, model.kv_producers, max_len, "capacity"))
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
                               pad=self.device.type == "cuda" if pad is None else pad, compile=compile,
                               graphs=(self.device.type == "cuda" and not compile) if graphs is None else graphs,
                               buckets=o.buckets)
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
        self.attention = attention_backend(self.device, self.dtype, bs)
        self._entry_bytes = kv_bytes(self.attention, 1, 1, 1, 1, model.shape.kv_heads, model.shape.head_dim, elem)

    def warmup(self, sampling=(False, True)) -> int:
        """Capture every static pass shape now (graphs on; greedy and sampling head passes):
        -> how many were captured (0 when all were, or without graphs)."""
        with torch.no_grad(), self.stepper.relax.installed():
            return self.stepper.warmup(sampling)

    # ------------------------------------------------------------------ run
    def __del__(self):
        st = self.__dict__.get("stepper")
        if st is not None:  # its pass functions close over it: without this, its pool waits for the collector
            st.release()

    def run(self, requests: list[Request], on_finish=None) -> EngineResult:
        """Serve ``requests``; ``on_finish(request_id, slot)`` (tests) runs as a sequence
        finishes, before its blocks are freed (``sequence_kv(slot)`` reads them)."""
        self._validate(requests)
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

    def _validate(self, requests: list[Request]) -> None:
        ids = [r.id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique")
        for r in requests:
            if not r.prompt:
                raise ValueError(f"request {r.id}: empty prompt (give at least one token, e.g. BOS)")
            if len(r.prompt) + r.max_new_tokens - 1 > self.max_len:
                raise ValueError(f"request {r.id}: prompt {len(r.prompt)} + {r.max_new_tokens} new tokens exceeds "
                                 f"the engine's max_len {self.max_len}")

    def _run(self, requests: list[Request], on_finish) -> EngineResult:
        """schedule -> run -> postprocess, with the postprocess of a pass deferred until the
        next pass is launched (the scheduler answers WAIT when it needs the results first)."""
        self.stepper.sampling = any(r.temperature > 0 for r in requests)
        if self.auto_warmup:  # every shape captured before the clock starts
            self.stepper.warmup((self.stepper.sampling,))
        captured = self.stepper.captures
        t_run = time.perf_counter()
        bm = self.blocks
        sched = Scheduler(self.batch, self.max_live, self.stepper.nr, self.policy, bm, self.write_cols)
        sched.depths_up_front = self.stepper.up_front
        res = EngineResult({}, self.batch, sched.max_live, attention=self.attention)
        for r in requests:
            need = bm.worst_case(len(r.prompt) + r.max_new_tokens - 1)
            if r.max_new_tokens < 1:
                res.outputs[r.id] = []
            elif need > bm.num_blocks:
                res.rejected[r.id] = (f"request {r.id}: {len(r.prompt)} prompt + {r.max_new_tokens} new tokens need up "
                                      f"to {need} KV blocks of {bm.bs} entries, the cache has {bm.num_blocks}; "
                                      f"give the engine more memory or shorten the request")
            else:
                sched.add(r)
        clock, back = PassClock(self.device), Readback(self.device, 2 * self.batch)
        self.stepper.launch = clock.launch
        pending = None
        while (p := sched.schedule(pending is not None)) is not None:
            if p == WAIT:
                sched.postprocess(pending[0], *back.get(pending[1]))
                pending = None
                continue
            out = self._execute(p, sched, res, clock, on_finish)
            if p.kind == "prefill":
                continue
            if pending is not None:  # the device runs p while the host applies the pass before it
                sched.postprocess(pending[0], *back.get(pending[1]))
            pending = (p, back.start(*out))
        for q in sched.finished:
            sched.outputs[q.request.id] += q.completion
        for r in requests:
            if r.id not in res.outputs and r.id not in res.rejected:
                res.outputs[r.id] = sched.outputs[r.id]
        res.admitted, res.preempted = sched.admitted, sched.preempted
        res.peak_blocks = bm.peak
        res.pass_s = clock.seconds()
        res.pass_cpu_s = clock.cpu_seconds()
        res.forward_s = sum(res.pass_s)
        res.wall_s = time.perf_counter() - t_run
        res.captures = self.stepper.captures - captured
        return res

    def _execute(self, p: Pass, sched: Scheduler, res: EngineResult, clock: "PassClock", on_finish):
        """Launch one pass; host bookkeeping that needs no device result; -> (routed, tokens)
        tensors on the device (None where the host already knows)."""
        st = self.stepper
        routed = tokens = None
        st.read, st.padded = [0, 0], len(p.seqs)
        clock.start()
        if p.kind == "prefill":
            clock.launch()
            self._prefill(p.seqs)
        elif p.kind == "enter":
            for q in p.seqs:  # (re)admitted: its sampling parameters go with its head passes
                r = q.request
                st.set_sampling(q.slot, r.temperature, r.top_p, r.seed)
            routed = st.enter(p.slots, [q.request.prompt[-1] for q in p.seqs], [q.position for q in p.seqs])
        elif p.kind == "block":
            routed = st.block(p.slots, p.depths, [q.position for q in p.seqs])
        else:
            tokens, routed = st.head(p.slots, [q.position for q in p.seqs], p.n_cont)
        clock.stop()
        counts = None
        if p.kind == "block":
            counts = [0] * st.nr
            for r in p.depths:
                counts[r] += 1
            counts = tuple(counts)
        res.record(p.kind, len(p.seqs), len(sched.waiting), len(sched.running), self.blocks.used, counts)
        res.attn_bytes.append(st.read[self.attention == "flash_paged"] * self._entry_bytes)
        res.padded.append(st.padded)
        if p.kind == "head":
            res.head_cont.append(p.n_cont)
        if p.kind == "head" and on_finish is not None:
            for q in p.seqs:
                if q.remaining == 1:
                    on_finish(q.request.id, q.slot)
        sched.ran(p)
        return routed, tokens

    def _prefill(self, seqs: list[Sequence]) -> None:
        """Prefill all but the last prompt token of ``seqs`` together (right-padded: causal
        attention and per-token routing keep the padding out of the real tokens' KV), then
        copy each sequence's entries into its blocks (PagedCache.write_prefill). One read-back
        of the entry counts per prefill (admission, not a decoding pass)."""
        from mor.model.decode import prefill

        T = [len(q.request.prompt) - 1 for q in seqs]
        Tm = max(T)
        ids = torch.zeros(len(seqs), Tm, dtype=torch.long)
        for i, q in enumerate(seqs):
            ids[i, : T[i]] = torch.tensor(q.request.prompt[:-1])
        pre, _ = prefill(self.model, ids.to(self.device), Tm)
        stores = [e for e in pre.slots]
        for e in stores:
            if pre.specs[e].kind == "dagger":
                pre.slots[e].mirror(pre.slots[pre.specs[e].source])
        lens = torch.tensor(T, device=self.device).unsqueeze(1)  # (n, 1)
        counts = torch.stack([(pre.slots[e].pos < lens).sum(1) for e in stores]).tolist()  # (E, n): real entries
        # per storing layer: the pool slots its entries go to (dst) and where they sit among the
        # prefill's (n x T) rows (src: each sequence's first counts[e][i]); one upload for all
        dst, src, sizes = [], [], []
        for e, per_seq in zip(stores, counts):
            Te = pre.slots[e].k.shape[2]
            dst += [self.blocks.fill(q.slot, int(self.blocks.col[e]), n) for q, n in zip(seqs, per_seq) if n]
            src += [i * Te + np.arange(n) for i, n in enumerate(per_seq) if n]
            sizes.append(sum(per_seq))
        none = [np.zeros(0, np.int64)]
        idx = torch.from_numpy(np.stack([np.concatenate(dst or none), np.concatenate(src or none)]).astype(np.int64)).to(self.device)
        for e, d, s in zip(stores, idx[0].split(sizes), idx[1].split(sizes)):
            k, v = pre.slots[e].k, pre.slots[e].v  # (n, Hkv, T, hd)
            self.cache.write_prefill(d, k.transpose(1, 2).flatten(0, 1)[s], v.transpose(1, 2).flatten(0, 1)[s])
