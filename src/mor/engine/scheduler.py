"""Who runs: the request queue, the live sequences, and the in-flight token pools.

    waiting   FIFO of requests not started (a preempted sequence goes back to the front)
    running   live sequences, at most ``max_live``: each holds a sequence slot (its state and
              its KV blocks). Live sequences are decoupled from the compute batch B: the
              engine admits while their KV fits the memory (flops.max_batch, blocks.py)
    depth[r]  slots whose in-flight token runs recursion r next (0-based), oldest first
    exited    slots whose token finished its recursions, waiting for the head, oldest first

Every live sequence has exactly one token in flight (its next token needs this one's head).

Policy 'depthwise' (continuous depth-wise batching, App. E), ``next_pass``:

    1. exited >= B                      head on the B oldest exited tokens
    2. tokens waiting at any depth >= B  one shared-block pass of B rows taken from ANY
                                        depth: the deepest first (so tokens drain to the
                                        head and their sequences' next tokens enter), then
                                        FIFO by the time they reached that depth
    3. some exited                      head on all of them (their next tokens refill
                                        depth 0, so rows freed by early exits are refilled)
    4. some at a depth                  a partial shared-block pass (nothing else can run)

With more live sequences than B (admission by memory), 2 keeps the passes full.

Policy 'lockstep' (the engine before App. E's batching, kept for the benchmark): B live
sequences; the shallowest non-empty depth runs alone, with all its rows; the head runs
when every in-flight token has exited (or B have).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

POLICIES = ("depthwise", "lockstep")


@dataclass(frozen=True)
class Request:
    """A prompt to continue greedily by ``max_new_tokens`` tokens."""

    id: int
    prompt: list[int]
    max_new_tokens: int


@dataclass
class Sequence:
    """A live request: its slot, tokens generated so far (count; the ids stay on the device
    until the run ends), where its in-flight token goes, and when it was admitted."""

    request: Request
    slot: int
    age: int
    generated: int = 0
    exit_depth: int | None = None  # token-choice: recursions the in-flight token runs
    done_before: list[int] = field(default_factory=list)  # tokens generated before a preemption

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - self.generated

    @property
    def position(self) -> int:
        """Position of the in-flight token (the last prompt or generated token)."""
        return len(self.request.prompt) - 1 + self.generated


class Scheduler:
    def __init__(self, batch: int, max_live: int, num_recursions: int, policy: str = "depthwise"):
        if batch < 1 or max_live < 1:
            raise ValueError(f"engine batch and max_live must be >= 1, got {batch}, {max_live}")
        if policy not in POLICIES:
            raise ValueError(f"engine policy {policy!r}; choose one of {POLICIES}")
        if policy == "lockstep":
            max_live = min(max_live, batch)
        self.batch, self.max_live, self.policy = batch, max_live, policy
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Sequence] = {}
        self.free_slots: deque[int] = deque(range(max_live))
        self.depth: list[deque[int]] = [deque() for _ in range(num_recursions)]
        self.exited: deque[int] = deque()
        self.admissions = 0

    # ------------------------------------------------------------------ sequences
    def can_admit(self) -> bool:
        return bool(self.waiting) and bool(self.free_slots)

    def admit(self) -> Sequence:
        req = self.waiting.popleft()
        seq = Sequence(req, self.free_slots.popleft(), self.admissions)
        self.admissions += 1
        self.running[seq.slot] = seq
        return seq

    def finish(self, seq: Sequence) -> None:
        del self.running[seq.slot]
        self.free_slots.append(seq.slot)

    def drop(self, seq: Sequence) -> None:
        """Remove a preempted sequence's in-flight token from the pools and free its slot."""
        for pool in (*self.depth, self.exited):
            if seq.slot in pool:
                pool.remove(seq.slot)
        self.finish(seq)

    def youngest(self) -> Sequence:
        return max(self.running.values(), key=lambda s: s.age)

    # ------------------------------------------------------------------ passes
    def in_flight(self) -> int:
        return sum(map(len, self.depth)) + len(self.exited)

    def next_pass(self):
        """('head', slots) or ('block', [(slot, recursion)]) or None when nothing is in flight."""
        B, n_exit, n_depth = self.batch, len(self.exited), sum(map(len, self.depth))
        if self.policy == "lockstep":
            if n_exit and (n_exit >= B or n_exit == self.in_flight()):
                return "head", [self.exited.popleft() for _ in range(min(n_exit, B))]
            for r, pool in enumerate(self.depth):
                if pool:
                    rows = [(pool.popleft(), r) for _ in range(min(len(pool), B))]
                    return "block", rows
            return None
        if n_exit >= B or (n_exit and n_depth < B):
            return "head", [self.exited.popleft() for _ in range(min(n_exit, B))]
        if n_depth:
            rows = []
            for r in reversed(range(len(self.depth))):  # deepest first, then FIFO by age
                pool = self.depth[r]
                while pool and len(rows) < B:
                    rows.append((pool.popleft(), r))
            return "block", rows
        return None
