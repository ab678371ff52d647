"""The engine loop: continuous depth-wise batching (App. E) over scheduler, cache and step.

    engine = Engine(model, capacity=32, max_len=512)
    result = engine.run([Request(id=0, prompt=[1], max_new_tokens=256), ...])
    result.outputs[0]   # the greedy tokens, equal to decode.generate on that prompt alone

Each iteration asks the scheduler for the next stage and runs it on the whole pool:

    admit    free slots take the next waiting requests; each prompt is prefilled alone
             (decode.prefill: one chunked pass over the prompt, the cached path the tests
             already check against the full causal forward) into a batch-1 cache whose
             row is copied into the slot; its last logits give the first new token
    depth r  the rows waiting at recursion r run it together (step.recursion)
    head     the exited rows (FIFO, up to capacity) run the suffix + head (step.leave);
             finished sequences free their slots, which are refilled at once, and every
             next token (continuing sequences first, then new ones, FIFO) runs the
             embedding + prefix (step.enter) and waits at depth 0

Prefill is per request and not batched: the throughput protocol starts every request from
a one-token prompt (no prefix), so it is one token's cost. ``forward_s`` sums the time
inside the stage calls and prefills (synchronised on a GPU), as App. E times the forward
passes; ``wall_s`` is the whole run, scheduling and bookkeeping included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mor.engine.cache import SlotCache
from mor.engine.scheduler import Request, Scheduler
from mor.engine.step import Rows, Stepper


@dataclass
class EngineResult:
    outputs: dict[int, list[int]]  # request id -> generated token ids (greedy)
    steps: int  # stage calls (one model forward each: a recursion group or a head group)
    occupancy: list[float] = field(default_factory=list)  # per step: fraction of slots holding a live sequence
    forward_s: float = 0.0  # time inside model forward passes (synchronised on a GPU)
    wall_s: float = 0.0  # whole run
    rows: list[int] = field(default_factory=list)  # per step: tokens the stage took (depth r: its candidates)
    ran: list[int] = field(default_factory=list)  # per step: tokens that ran the stage's layers (kept by the router)
    stages: list[str] = field(default_factory=list)  # per step: 'head' or 'depth<r>'
    waiting: list[int] = field(default_factory=list)  # per step: requests still in the queue
    admitted: list[int] = field(default_factory=list)  # request ids in the order they took a slot

    @property
    def tokens(self) -> int:
        return sum(len(v) for v in self.outputs.values())


class Engine:
    """Greedy continuous depth-wise batching of ``model`` with ``capacity`` sequence slots of up
    to ``max_len`` tokens each (prompt + generated). The model is moved to ``device`` /
    ``dtype`` and put in eval mode; the static cache is allocated once."""

    def __init__(self, model, capacity: int, max_len: int, device=None, dtype=None):
        w = model.embed_tokens.weight
        self.device = torch.device(device) if device is not None else w.device
        self.dtype = dtype or w.dtype
        if model.cfg.relaxation == "prefix":
            raise NotImplementedError("the engine does not support the prefix relaxation (its keys are not cached per slot)")
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.capacity, self.max_len = capacity, max_len
        self.cache = SlotCache(self.model, capacity, max_len, self.dtype, self.device)
        self.stepper = Stepper(self.model, self.cache)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def run(self, requests: list[Request]) -> EngineResult:
        from mor.model.decode import prefill

        t_run = time.perf_counter()
        nr = len(self.model.plan.recursions)
        sched = Scheduler(list(requests), self.capacity, nr, self.max_len)
        for s in range(self.capacity):
            self.cache.clear(s)
        res = EngineResult({}, 0)
        fwd = 0.0

        def timed(fn, *args):
            nonlocal fwd
            self._sync()
            t = time.perf_counter()
            out = fn(*args)
            self._sync()
            fwd += time.perf_counter() - t
            return out

        def admit() -> list[tuple[int, int, int]]:
            """Fill free slots; (slot, token, position) of each new sequence's first token to feed."""
            feed = []
            while True:
                new = sched.admit()
                if not new:
                    return feed
                for seq in new:
                    res.admitted.append(seq.request.id)
                    prompt = torch.tensor([seq.request.prompt], device=self.device)  # (1, T)
                    pre, logits = timed(prefill, self.model, prompt, self.max_len)
                    self.cache.clear(seq.slot)
                    self.cache.load(seq.slot, pre)
                    seq.generated.append(int(logits[0].argmax()))
                    if seq.done:
                        sched.finish(seq)
                    else:
                        feed.append((seq.slot, seq.generated[-1], seq.next_position))

        def enter(feed) -> None:
            if feed:
                slots, ids, pos = zip(*feed)
                sched.depth[0].append(timed(self.stepper.enter, list(slots), list(ids), list(pos)))

        enter(admit())
        while (stage := sched.next_stage()) is not None:
            res.occupancy.append(sched.occupancy())
            res.waiting.append(len(sched.waiting))
            kind, r = stage
            if kind == "head":
                rows = Rows.cat(sched.exited)
                n = min(len(rows), self.capacity)
                head, rest = (rows, None) if n == len(rows) else (rows.take(list(range(n))), rows.take(list(range(n, len(rows)))))
                sched.exited = [rest] if rest is not None else []
                tokens = timed(self.stepper.leave, head)
                res.rows.append(n)
                res.ran.append(n)
                res.stages.append("head")
                feed = []
                for slot, tok in zip(head.seq, tokens):
                    seq = sched.slots[slot]
                    seq.generated.append(tok)
                    if seq.done:
                        sched.finish(seq)
                    else:
                        feed.append((slot, tok, seq.next_position))
                enter(feed + admit())
            else:
                rows = Rows.cat(sched.depth[r])
                sched.depth[r] = []
                run, stay = timed(self.stepper.recursion, r, rows)
                res.rows.append(len(rows))
                res.ran.append(0 if run is None else len(run))
                res.stages.append(f"depth{r}")
                if stay is not None:
                    sched.exited.append(stay)
                if run is not None:
                    (sched.depth[r + 1] if r + 1 < nr else sched.exited).append(run)
            res.steps += 1
        res.outputs = sched.finished
        res.forward_s = fwd
        res.wall_s = time.perf_counter() - t_run
        return res
