"""Who runs (nano-vllm's ``Scheduler``): the request queue, the live sequences, the in-flight
token pools; ``schedule`` picks the next pass, ``preempt`` frees memory, ``postprocess``
applies a pass's results (routing decisions, tokens) once they are read back.

    waiting   FIFO of requests not started (a preempted sequence goes back to the front)
    running   live sequences, at most ``max_live``: each holds a sequence slot (its state and
              its KV blocks). Live sequences are decoupled from the compute batch B: the
              engine admits while their KV fits the memory (flops.max_batch, blocks.py)
    entering  slots whose in-flight token is a prompt's last token, not yet entered
    depth[r]  slots whose in-flight token runs recursion r next (0-based), oldest first
    exited    slots whose token finished its recursions, waiting for the head, oldest first

Every live sequence has exactly one token in flight (its next token needs this one's head);
a token whose pass has run but whose results are not yet read back is in none of the pools.

Passes (``schedule``), in this order:

    prefill   up to B newly admitted sequences with prompts of T > 1 tokens: their first
              T - 1 tokens, together (admission is tried at the start and after each head pass)
    enter     up to B entering tokens: embedding, prefix layers, the first routing decision
    then, policy 'depthwise' (continuous depth-wise batching, App. E):
    1. exited >= B                       head on the B oldest exited tokens
    2. tokens waiting at any depth >= B  one shared-block pass of B rows taken from ANY
                                         depth: the deepest first, then FIFO
    3. some exited                       head on all of them (their next tokens enter at
                                         depth 0 in the same pass)
    4. some at a depth                   a partial shared-block pass
    policy 'lockstep' (the engine before App. E's batching, kept for the benchmark): B live
    sequences; the shallowest non-empty depth runs alone; the head runs when every in-flight
    token has exited (or B have).

Deferred results: the engine runs pass k+1 before it reads pass k's results back, so the
host plans while the device runs. ``schedule(pending=True)`` therefore answers WAIT instead
of a pass that would be partial or would need a preemption (both may change once the
pending results are in); the engine then reads them back and asks again.

Memory: before a pass is handed out, the blocks its rows append are checked free
(blocks.needed); if not, the youngest live sequence is preempted (its blocks freed, the
request back at the front of the queue extended by what it generated, recomputed when
readmitted) until the pass fits.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field

from mor.engine.blocks import BlockManager
from mor.engine.sequence import Request, Sequence  # noqa: F401 (Request re-exported)

POLICIES = ("depthwise", "lockstep")
WAIT = "wait"  # schedule(pending=True): read the pending pass back first


@dataclass
class Pass:
    """One device pass: kind 'prefill' | 'enter' | 'block' | 'head', its sequences (rows in
    order), each row's recursion (block passes), and how many head rows continue (their
    next tokens enter in the same pass: the first ``n_cont``)."""

    kind: str
    seqs: list[Sequence]
    depths: list[int] = field(default_factory=list)
    n_cont: int = 0

    @property
    def slots(self) -> list[int]:
        return [q.slot for q in self.seqs]


class Scheduler:
    def __init__(self, batch: int, max_live: int, num_recursions: int, policy: str = "depthwise",
                 blocks: BlockManager | None = None, write_cols: dict | None = None):
        if batch < 1 or max_live < 1:
            raise ValueError(f"engine batch and max_live must be >= 1, got {batch}, {max_live}")
        if policy not in POLICIES:
            raise ValueError(f"engine policy {policy!r}; choose one of {POLICIES}")
        if policy == "lockstep":
            max_live = min(max_live, batch)
        self.batch, self.max_live, self.policy, self.nr = batch, max_live, policy, num_recursions
        self.blocks, self.write_cols = blocks, write_cols or {}
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Sequence] = {}
        self.free_slots: deque[int] = deque(range(max_live))
        self.entering: deque[int] = deque()
        self.depth: list[deque[int]] = [deque() for _ in range(num_recursions)]
        self.exited: deque[int] = deque()
        self.admissions = 0
        self.may_admit = True  # admission is tried at the start and after each head pass
        self.admitted: list[int] = []  # request ids in the order they went live
        self.preempted: list[int] = []
        self.outputs: dict[int, list[int]] = {}  # request id -> tokens generated in earlier admissions
        self.finished: list[Sequence] = []
        self.unfilled: list[Sequence] = []  # admitted, prompt not yet prefilled

    # ------------------------------------------------------------------ sequences
    def add(self, req: Request) -> None:
        self.waiting.append(req)
        self.outputs.setdefault(req.id, [])

    def can_admit(self) -> bool:
        return bool(self.waiting) and bool(self.free_slots)

    def admit(self) -> Sequence:
        req = self.waiting.popleft()
        seq = Sequence(req, self.free_slots.popleft(), self.admissions)
        self.admissions += 1
        self.running[seq.slot] = seq
        self.admitted.append(req.id)
        return seq

    def finish(self, seq: Sequence) -> None:
        """A sequence generated its last token: slot and blocks back (its token ids arrive
        with the pass's readback)."""
        self._free(seq)
        self.finished.append(seq)

    def _free(self, seq: Sequence) -> None:
        del self.running[seq.slot]
        self.free_slots.append(seq.slot)
        if self.blocks is not None:
            self.blocks.release(seq.slot)

    def drop(self, seq: Sequence) -> None:
        """Remove a sequence's in-flight token from the pools and free its slot and blocks."""
        for pool in (self.entering, *self.depth, self.exited):
            if seq.slot in pool:
                pool.remove(seq.slot)
        self._free(seq)

    def youngest(self) -> Sequence:
        return max(self.running.values(), key=lambda s: s.age)

    def preempt(self) -> Sequence:
        """Free the youngest live sequence; it resumes from the front of the queue, its prompt
        extended by what it generated (recomputed when readmitted). Its results must be read
        back (nothing of it pending)."""
        victim = self.youngest()
        req = victim.request
        mine = victim.completion
        self.outputs[req.id] += mine
        self.drop(victim)
        self.waiting.appendleft(dataclasses.replace(req, prompt=req.prompt + mine,
                                                    max_new_tokens=req.max_new_tokens - len(mine)))
        self.preempted.append(req.id)
        return victim

    # ------------------------------------------------------------------ passes
    def in_flight(self) -> int:
        return len(self.entering) + sum(map(len, self.depth)) + len(self.exited)

    def _admit_all(self) -> list[Sequence]:
        """Admit while a slot and the blocks for the prompt are free (nano-vllm's can_allocate)."""
        new, reserved = [], 0  # blocks the prompts admitted here (not yet prefilled) may take
        while self.can_admit():
            req = self.waiting[0]
            if self.blocks is not None:
                need = self.blocks.worst_case(len(req.prompt))
                if reserved + need > len(self.blocks.free):
                    break  # wait for blocks
                reserved += need
            seq = self.admit()
            self.entering.append(seq.slot)
            new.append(seq)
        return new

    def _candidate(self):
        """The next pass's (kind, rows) without taking them from the pools: rows are slots,
        or (slot, recursion) for a block pass; None when nothing is in flight."""
        B = self.batch
        if self.entering:
            return "enter", list(self.entering)[:B]
        n_exit, n_depth = len(self.exited), sum(map(len, self.depth))
        if self.policy == "lockstep":
            if n_exit and (n_exit >= B or n_exit == self.in_flight()):
                return "head", list(self.exited)[:B]
            for r, pool in enumerate(self.depth):
                if pool:
                    return "block", [(s, r) for s in list(pool)[:B]]
            return None
        if n_exit >= B or (n_exit and n_depth < B):
            return "head", list(self.exited)[:B]
        if n_depth:
            rows = []
            for r in reversed(range(self.nr)):  # deepest first, then FIFO by age
                for s in self.depth[r]:
                    if len(rows) == B:
                        break
                    rows.append((s, r))
            return "block", rows
        return None

    def _stage(self, kind: str, rows) -> dict[int, object]:
        if kind == "block":
            return {s: ("block", r) for s, r in rows}
        if kind == "enter":
            return {s: "enter" for s in rows}
        return {s: ("head", "enter") if self.running[s].remaining > 1 else "head" for s in rows}

    def _fits(self, kind: str, rows) -> bool:
        if self.blocks is None:
            return True
        stage = self._stage(kind, rows)
        return self.blocks.needed([(s, self.write_cols[k]) for s, k in stage.items()]) <= len(self.blocks.free)

    def schedule(self, pending: bool = False):
        """The next Pass, WAIT (``pending``: read the pending pass back first), or None when
        nothing is in flight."""
        if self.may_admit:
            self.may_admit = False
            self.unfilled += [q for q in self._admit_all() if len(q.request.prompt) > 1]
        if self.unfilled:  # up to B prompts prefilled together before their tokens enter
            pre, self.unfilled = self.unfilled[: self.batch], self.unfilled[self.batch:]
            return Pass("prefill", pre)
        while True:
            cand = self._candidate()
            if cand is None:
                return WAIT if pending else None
            kind, rows = cand
            if pending and kind != "enter" and (len(rows) < self.batch or self.policy == "lockstep"):
                return WAIT  # the pending results may fill it (lockstep: may make it another depth's)
            if self._fits(kind, rows):
                return self._take(kind, rows)
            if pending:
                return WAIT
            if len(self.running) <= 1:
                raise RuntimeError("a lone sequence does not fit the KV cache; this request should have been rejected")
            self.preempt()

    def _take(self, kind: str, rows) -> Pass:
        if kind == "block":
            for s, r in rows:
                self.depth[r].remove(s)
            return Pass("block", [self.running[s] for s, _ in rows], [r for _, r in rows])
        pool = self.entering if kind == "enter" else self.exited
        for s in rows:
            pool.remove(s)
        seqs = [self.running[s] for s in rows]
        if kind == "enter":
            return Pass("enter", seqs)
        seqs.sort(key=lambda q: q.remaining <= 1)  # continuing sequences first
        return Pass("head", seqs, n_cont=sum(q.remaining > 1 for q in seqs))

    # ------------------------------------------------------------------ results
    def ran(self, p: Pass) -> None:
        """Host bookkeeping as soon as a pass is launched: a head pass generated one token per
        row; finished sequences free their slots and blocks (their token arrives later)."""
        if p.kind != "head":
            return
        for q in p.seqs:
            q.generated += 1
            if q.remaining == 0:
                self.finish(q)
        self.may_admit = True

    def _route_entered(self, seqs: list[Sequence], vals) -> None:
        """After a token entered: depth 0, or straight to the head if router 1 dropped it
        (token-choice: vals are the depths - 1)."""
        for i, q in enumerate(seqs):
            if vals is None:
                self.depth[0].append(q.slot)
            elif self.depths_up_front:
                q.exit_depth = int(vals[i]) + 1
                self.depth[0].append(q.slot)
            elif vals[i]:
                self.depth[0].append(q.slot)
            else:
                self.exited.append(q.slot)

    depths_up_front = False  # set by the engine (token-choice): enter's output is each token's depth - 1

    def postprocess(self, p: Pass, routed: list[int] | None, tokens: list[int] | None) -> None:
        """Apply a pass's read-back results: routing decisions (``routed``: keep flags or
        token-choice depths, None when the host already knew) and the head's tokens."""
        if p.kind == "enter":
            self._route_entered(p.seqs, routed)
        elif p.kind == "block":
            for i, (q, r) in enumerate(zip(p.seqs, p.depths)):
                last = q.exit_depth if q.exit_depth is not None else self.nr
                go = r + 1 < last and (routed is None or routed[i])
                (self.depth[r + 1] if go else self.exited).append(q.slot)
        elif p.kind == "head":
            for q, t in zip(p.seqs, tokens):
                q.token_ids.append(int(t))
            self._route_entered(p.seqs[: p.n_cont], routed)
