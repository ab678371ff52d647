"""What a run of the engine returns (``EngineResult``): the tokens, and per pass its kind,
rows, queue, live sequences, blocks, time and attention bytes, with the figures App. E's
protocol reads from them (one steady-state ``window``, passes per token, row fill)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineResult:
    outputs: dict[int, list[int]]  # request id -> generated token ids (greedy)
    batch: int = 0  # B, rows per pass
    max_live: int = 0  # admission limit (sequences)
    kinds: list[str] = field(default_factory=list)  # per pass: 'enter', 'block' or 'head'
    rows: list[int] = field(default_factory=list)  # per pass: rows run (before padding)
    padded: list[int] = field(default_factory=list)  # per pass: the rows it ran at (its row bucket; == rows unpadded)
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
        sel = self._window(while_waiting)
        block = [i for i in sel if self.kinds[i] == "block"]
        tokens = sum(self.rows[i] for i in sel if self.kinds[i] == "head")
        secs = sum(self.pass_s[i] for i in sel) if self.pass_s else 0.0
        cpu = sum(self.pass_cpu_s[i] for i in sel) if self.pass_cpu_s else 0.0
        return {"tokens": tokens, "block_passes": len(block), "passes": len(sel),
                "row_fill": sum(self.rows[i] for i in block) / (self.batch * len(block)) if block else 0.0,
                "passes_per_token": len(block) / tokens if tokens else 0.0,
                "forward_s": secs, "tokens_per_s": tokens / secs if secs > 0 else 0.0,
                "cpu_s": cpu, "tokens_per_cpu_s": tokens / cpu if cpu > 0 else 0.0}

    def _window(self, while_waiting: bool = True) -> list[int]:
        """The passes of ``window``: requests waiting or >= 2B live (every pass if not ``while_waiting``)."""
        return [i for i, (w, n) in enumerate(zip(self.waiting, self.live))
                if w > 0 or n >= 2 * self.batch or not while_waiting]

    def rows_per_pass(self, while_waiting: bool = True) -> dict[str, tuple[int, float, float]]:
        """Per pass kind ('enter', 'block', 'head'), over ``window``'s passes (or the whole run):
        (passes, mean rows, mean rows after padding). The two means differ by the padding rows
        a pass of fixed shape computes (row buckets, shapes.row_buckets); the head's enter part
        and the block's routers are not in them."""
        out = {}
        sel = self._window(while_waiting)
        for kind in ("enter", "block", "head"):
            ix = [i for i in sel if self.kinds[i] == kind]
            if ix:
                out[kind] = (len(ix), sum(self.rows[i] for i in ix) / len(ix),
                             sum(self.padded[i] for i in ix) / len(ix) if self.padded else float("nan"))
        return out

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
