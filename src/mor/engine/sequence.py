"""A request and the live sequence serving it (nano-vllm's ``Sequence``): the sequence owns
its token ids (prompt + generated, host), its slot, and where its in-flight token goes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    """A prompt to continue by ``max_new_tokens`` tokens: greedily (``temperature`` 0, the
    default and App. E's protocol), or sampled at ``temperature`` from the smallest set of
    tokens whose probability reaches ``top_p``, with ``seed``: a token's draw depends on
    (seed, its position) only (sampling.py), so it is the same at any batch, policy or
    preemption."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"request {self.id}: temperature must be >= 0 and top_p in (0, 1], "
                             f"got {self.temperature}, {self.top_p}")


@dataclass
class Sequence:
    """A live request.

    token_ids    prompt + the generated tokens read back so far (the readback of a pass is
                 deferred by one pass, so the newest token may still be on the device)
    generated    tokens generated so far (host-known at once: one per head pass)
    exit_depth   token-choice: recursions the in-flight token runs (None: the routers decide)
    """

    request: Request
    slot: int
    age: int
    generated: int = 0
    exit_depth: int | None = None
    token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.request.prompt)

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - self.generated

    @property
    def position(self) -> int:
        """Position of the in-flight token (the last prompt or generated token)."""
        return len(self.request.prompt) - 1 + self.generated

    @property
    def completion(self) -> list[int]:
        """The generated tokens read back (since this admission)."""
        return self.token_ids[len(self.request.prompt):]
