"""The engine's options in one typed object (no torch: configs and jobs import it cheaply).

    Engine(model, EngineOptions(batch=32, max_len=512, memory_bytes=80e9), device="cuda")
    Engine(model, batch=32, max_len=512)   # the same fields as keywords
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("depthwise", "lockstep")


@dataclass(frozen=True)
class EngineOptions:
    # compute: rows per pass and the sequences' length
    batch: int = 32  # B, rows of one pass (compute); the live sequences are as many as their KV fits
    max_len: int = 512  # tokens per sequence (prompt + generated)
    # memory: App. E's memory model, or the limit and the pool stated directly
    memory_bytes: float | None = None  # parameters + KV budget: admission limit flops.max_batch, blocks the rest
    max_live: int | None = None  # admission limit (default 2B; lockstep B)
    num_blocks: int | None = None  # KV blocks in the pool (default: every live token at every layer)
    block_size: int | None = None  # entries per block (default 256 with flash-attn's paged kernel, else 16)
    # scheduling
    policy: str = "depthwise"  # 'depthwise' (App. E) or 'lockstep' (one depth per pass; the old policy)
    # execution (step.py)
    pad: bool | None = None  # pad rows to fixed sizes (default: on a GPU)
    compile: bool | str = False  # torch.compile each pass's device part (True: inductor, or a backend name)
    graphs: bool | None = None  # static buffers per shape, CUDA graphs on a GPU (default: on a GPU unless compile)
    buckets: tuple[int, ...] | None = None  # row counts padded passes run at (default: powers of two up to B)
    warmup: bool = True  # with graphs: capture every shape before a run's first pass (else lazily)

    def __post_init__(self):
        if self.batch is None or self.batch < 1:
            raise ValueError(f"engine batch must be >= 1, got {self.batch}")
        if self.max_len < 1:
            raise ValueError(f"engine max_len must be >= 1, got {self.max_len}")
        if self.policy not in POLICIES:
            raise ValueError(f"engine policy must be one of {POLICIES}, got {self.policy!r}")
        if self.graphs and self.compile:
            raise ValueError("the engine takes graphs= or compile=, not both")
