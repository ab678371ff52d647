"""Who runs: the FIFO request queue, the fixed set of sequence slots, and the token pools.

    waiting   FIFO of requests not started yet
    slots     ``capacity`` sequence slots; a slot holds one live sequence (its KV rows in
              the static cache) or is free. A finished sequence frees its slot and the next
              waiting request takes it at once, so the batch stays full while the queue is
              non-empty.
    pools     the in-flight tokens (one per live sequence): ``depth[r]`` holds the tokens
              waiting to enter recursion r (0-based); ``exited`` the tokens whose recursions
              are done, FIFO, waiting for the last unshared layers + norm + LM head.

Scheduling policy (``next_stage``), App. E: tokens at the same recursion depth run through
the shared block together (the shallowest non-empty depth first); tokens that exit early
accumulate in ``exited`` until it holds ``capacity`` tokens, or every in-flight token (a
sequence's next token enters only after its current one has left the head, so no more can
come), and then run the head together in FIFO order; their sequences' next tokens re-enter
at depth 0 in the same order. Execution (the model step) is ``step.py``; KV bookkeeping
``cache.py``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    """A prompt to continue greedily by ``max_new_tokens`` tokens."""

    id: int
    prompt: list[int]
    max_new_tokens: int


@dataclass
class Sequence:
    """A live request: its slot, the tokens generated so far, and where the next one goes."""

    request: Request
    slot: int
    generated: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.request.max_new_tokens

    @property
    def next_position(self) -> int:
        """Position of the last generated token, the one to feed next."""
        return len(self.request.prompt) + len(self.generated) - 1


class Scheduler:
    """FIFO queue + fixed slots + per-depth token pools (see the module docstring)."""

    def __init__(self, requests, capacity: int, num_recursions: int, max_len: int):
        if capacity < 1:
            raise ValueError(f"engine capacity must be >= 1, got {capacity}")
        ids = [r.id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique")
        for r in requests:
            if not r.prompt:
                raise ValueError(f"request {r.id}: empty prompt (give at least one token, e.g. BOS)")
            if len(r.prompt) + r.max_new_tokens - 1 > max_len:
                raise ValueError(f"request {r.id}: prompt {len(r.prompt)} + {r.max_new_tokens} new tokens exceeds "
                                 f"the engine's max_len {max_len}")
        self.waiting: deque[Request] = deque(requests)
        self.slots: list[Sequence | None] = [None] * capacity
        self.capacity = capacity
        self.depth: list[list] = [[] for _ in range(num_recursions)]  # per depth: chunks of rows (step.Rows)
        self.exited: list = []  # FIFO chunks of rows that left the recursions
        self.finished: dict[int, list[int]] = {}

    # ------------------------------------------------------------------ slots
    def admit(self) -> list[Sequence]:
        """Fill every free slot from the queue (FIFO); returns the new sequences. Requests with
        nothing to generate finish at once without a slot."""
        new = []
        for s in range(self.capacity):
            while self.slots[s] is None and self.waiting:
                req = self.waiting.popleft()
                if req.max_new_tokens < 1:
                    self.finished[req.id] = []
                    continue
                self.slots[s] = Sequence(req, s)
                new.append(self.slots[s])
        return new

    def finish(self, seq: Sequence) -> None:
        """Record a sequence's output and free its slot."""
        self.finished[seq.request.id] = seq.generated
        self.slots[seq.slot] = None

    @property
    def live(self) -> int:
        return sum(s is not None for s in self.slots)

    def occupancy(self) -> float:
        return self.live / self.capacity

    # ------------------------------------------------------------------ pools
    def in_flight(self) -> int:
        return sum(len(c) for pool in self.depth for c in pool) + sum(len(c) for c in self.exited)

    def next_stage(self):
        """('head', None) or ('depth', r), or None when nothing is in flight."""
        n_exit = sum(len(c) for c in self.exited)
        if n_exit and (n_exit >= self.capacity or n_exit == self.in_flight()):
            return "head", None
        for r, pool in enumerate(self.depth):
            if pool:
                return "depth", r
        return None
