"""The engine loop: continuous depth-wise batching (App. E), nano-vllm's schedule -> run ->
postprocess over scheduler.py, blocks.py, cache.py, step.py (docs/engine.md).

    engine = Engine(model, batch=32, max_len=512, memory_bytes=80e9)
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
every figure over one steady-state window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mor.engine.blocks import BlockManager
from mor.engine.cache import FLASH_PAGE, PagedCache, attention_backend, flash_paged, kv_bytes
from mor.engine.scheduler import WAIT, Pass, Scheduler
from mor.engine.sequence import Request, Sequence
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
    pass_s: list[float] = field(default_factory=list)  # per pass: seconds inside it (CUDA events on a GPU)
    pass_cpu_s: list[float] = field(default_factory=list)  # per pass on a CPU: the process's CPU seconds in it
    head_cont: list[int] = field(default_factory=list)  # per head pass: rows whose next token entered in it
    attn_bytes: list[int] = field(default_factory=list)  # per pass: K/V bytes its attention reads (cache.kv_bytes)
    attention: str = ""  # the paged attention's backend (cache.attention_backend)
    captures: int = 0  # static pass shapes captured inside this run (0 after warm-up: none in the measured loop)
    forward_s: float = 0.0  # time inside the passes and prefills (the sum of pass_s)
    wall_s: float = 0.0  # whole run

    def record(self, kind: str, n: int, waiting: int, live: int, blocks: int, depth_rows=None) -> None:
        self.kinds.append(kind)
        self.rows.append(n)
        self.waiting.append(waiting)
        self.live.append(live)
        self.blocks.append(blocks)
        if depth_rows is not None:
            self.depth_rows.append(depth_rows)

    def window(self, while_waiting: bool = True) -> dict:
        """Every figure over ONE window of passes: the steady state App. E's batching is about,
        the passes run while requests wait in the queue or at least 2B sequences are live
        (enough in flight to fill every pass from any depth: App. E's protocol admits every
        request at once when the memory holds them all, so its queue never waits); or the
        whole run (``while_waiting=False``).

        tokens            tokens generated (head rows) in the window
        block_passes      shared-block passes in it
        row_fill          mean rows per shared-block pass / B
        passes_per_token  block_passes / tokens (Σ c_r / B when every pass is full)
        forward_s         seconds inside the window's passes (prefills included)
        tokens_per_s      tokens / forward_s
        cpu_s, tokens_per_cpu_s  the same over the process's CPU seconds (CPU runs: robust to
                          other jobs on a shared machine; 0 on a GPU)"""
        sel = [i for i, (w, n) in enumerate(zip(self.waiting, self.live))
               if w > 0 or n >= 2 * self.batch or not while_waiting]
        block = [i for i in sel if self.kinds[i] == "block"]
        tokens = sum(self.rows[i] for i in sel if self.kinds[i] == "head")
        secs = sum(self.pass_s[i] for i in sel) if self.pass_s else 0.0
        cpu = sum(self.pass_cpu_s[i] for i in sel) if self.pass_cpu_s else 0.0
        return {"tokens": tokens, "block_passes": len(block), "passes": len(sel),
                "row_fill": sum(self.rows[i] for i in block) / (self.batch * len(block)) if block else 0.0,
                "passes_per_token": len(block) / tokens if tokens else 0.0,
                "forward_s": secs, "tokens_per_s": tokens / secs if secs > 0 else 0.0,
                "cpu_s": cpu, "tokens_per_cpu_s": tokens / cpu if cpu > 0 else 0.0}

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
        return self.window(while_waiting)["row_fill"]

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
    graphs      static buffers per row bucket, CUDA graphs on a GPU (step.StaticPass; default:
                on a GPU unless ``compile``); on a CPU the same path runs eagerly
    buckets     the row counts padded passes run at (implies ``pad``; default: powers of two
                up to the batch). ``(batch,)``: every pass at B rows, one row shape per pass kind
    warmup      with ``graphs``: capture every static pass shape (``Stepper.shapes``) before a
                run's first pass, outside its clocks (default on; ``warmup()`` does it at once,
                for greedy and sampling runs); off: shapes are captured the first time they occur
    """

    def __init__(self, model, batch: int | None = None, max_len: int = 512, device=None, dtype=None, *,
                 capacity: int | None = None, memory_bytes: float | None = None, max_live: int | None = None,
                 num_blocks: int | None = None, block_size: int | None = None, policy: str = "depthwise",
                 pad: bool | None = None, compile: bool | str = False, graphs: bool | None = None,
                 buckets=None, warmup: bool = True):
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
        self.batch, self.max_len, self.policy, self.auto_warmup = batch, max_len, policy, warmup
        self.specs = cache_layout(model.cfg, model.plan, model.kv_producers, max_len, "full")
        bs = block_size or (FLASH_PAGE if flash_paged(self.device) else 16)
        elem = torch.tensor([], dtype=self.dtype).element_size()
        n_store = sum(s.kind != "shared" for s in self.specs)
        block_bytes = 2 * bs * model.shape.kv_heads * model.shape.head_dim * elem
        if memory_bytes is not None:  # App. E's memory model is the admission limit
            # the same quantity the block manager allocates: whole blocks per sequence and layer
            max_live = max_batch(model.cfg, model.shape, model.vocab_size, max_len, memory_bytes, elem, block_size=bs)
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
                               buckets=buckets)
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
        sched.token_choice = self.stepper.token_choice
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
        st.read = [0, 0]
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


class PassClock:
    """Time inside each pass without a host sync between passes: CUDA events on a GPU (read
    once, when the run ends), the host clock on a CPU (where a pass runs synchronously),
    and there also the process's CPU seconds (what other jobs on a shared CPU inflate least).

    On a GPU a pass's start event is recorded at ``launch`` (the stepper calls it when the
    pass's device work starts: its upload), after the host planned it: a pass planned while
    the device was idle (lockstep, a partial pass after WAIT) would otherwise count the
    planning, one planned while the device ran the previous pass would not, and the two
    kinds of pass would not compare. The whole run's wall time (``wall_s``) counts it all.
    On a CPU the pass runs on the host, planning included, from ``start``."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.cpu: list = []

    def start(self) -> None:
        if self.cuda:
            self.marks.append([None, None])  # the start event: at launch
        else:
            self.marks.append([time.perf_counter(), None])
            self.cpu.append([time.process_time(), None])

    def launch(self) -> None:
        if self.cuda and self.marks and self.marks[-1][0] is None:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[-1][0] = ev

    def stop(self) -> None:
        if self.cuda:
            self.launch()  # a pass that launched nothing: zero seconds
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[-1][1] = ev
        else:
            self.marks[-1][1] = time.perf_counter()
            self.cpu[-1][1] = time.process_time()

    def seconds(self) -> list[float]:
        if self.cuda:
            if self.marks:
                self.marks[-1][1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in self.marks]
        return [b - a for a, b in self.marks]

    def cpu_seconds(self) -> list[float]:
        """Per pass: the process's CPU seconds in it (a CPU run; empty on a GPU)."""
        return [b - a for a, b in self.cpu]


class Readback:
    """A pass's results to the host, deferred: ``start`` queues one device-to-host copy of the
    routing decisions and tokens (into a pinned buffer, asynchronously, an event behind it);
    ``get`` waits for that event only when the scheduler needs the values, after the next
    pass is launched. On a CPU the values are read at ``get``."""

    RING = 4

    def __init__(self, device: torch.device, size: int):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.bufs = [torch.empty(size, dtype=torch.long, pin_memory=True) for _ in range(self.RING)]
        self.at = 0

    def start(self, routed, tokens):
        live = [t for t in (routed, tokens) if t is not None]
        if not live:
            return None, None, None, None
        flat = torch.cat([t.reshape(-1).to(torch.long) for t in live])
        ev = None
        if self.cuda:
            host = self.bufs[self.at][: flat.shape[0]]
            self.at = (self.at + 1) % self.RING
            host.copy_(flat, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            flat = host
        return flat, ev, None if routed is None else routed.shape[0], None if tokens is None else tokens.shape[0]

    @staticmethod
    def get(handle) -> tuple[list[int] | None, list[int] | None]:
        flat, ev, n_r, n_t = handle
        if flat is None:
            return None, None
        if ev is not None:
            ev.synchronize()
        vals = flat.tolist()  # host memory on a GPU (the event has completed); the pass's one read
        routed = vals[:n_r] if n_r is not None else None
        tokens = vals[n_r or 0:] if n_t is not None else None
        return routed, tokens
