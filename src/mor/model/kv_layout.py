"""The KV layout: what each effective layer keeps in the cache, and how many entries.

Pure and torch-free: the one definition that the inference caches (``kv_cache.KVCache``,
the engine's paged cache, mor.engine.cache) allocate by and that the memory model
(``mor.flops.kv_cache_entries`` / ``max_batch``) counts, so the two cannot disagree. It takes
the tying plan and KV producers it is given (a built model's ``model.plan`` /
``model.kv_producers``, or ``mor.flops``' cached ``plan_for``) and rebuilds neither.

Per effective layer e of ``plan.order`` (``producers[e]``: tying.kv_producers):

    own     e stores its own keys/values
    shared  e reads producer p's (stores nothing)
    dagger  e mirrors producer p's entries and overwrites those of the tokens that reached
            it with fresh KV (model.kv 'shared_dagger'): as many entries as p

Entries per sequence of max_len tokens (``sizing``):

    full      every storing layer max_len (a static cache that never overflows)
    capacity  the layers of recursion r hold tokens_kept(max_len, c_r): the share the
              routers are designed to keep. Expert-choice: the router capacities.
              Token-choice has no fixed capacity; its design is the balanced assignment
              its balancing loss / bias aims for, 1/Nr of the tokens per depth, so
              recursion r is reached by (Nr-r)/Nr (0-based r): the hierarchical
              capacities, the same fractions mor.flops counts FLOPs with. A static cache
              sized so fails loudly when the routers keep more; the paged engine cache
              allocates what they keep and preempts instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mor.capacity import tokens_kept
from mor.model.routers.registry import router_kind

SlotKind = Literal["own", "shared", "dagger"]
SIZINGS = ("full", "capacity")


@dataclass(frozen=True)
class SlotSpec:
    """What effective layer e keeps in the cache: its own slot, none (reads ``source``'s),
    or a dagger slot mirroring ``source``. ``size``: entries per sequence (0 for shared)."""

    kind: SlotKind
    source: int
    size: int


def recursion_of(plan, e: int) -> int | None:
    """Recursion (0-based) that effective layer e belongs to; None for prefix/suffix."""
    start, per = len(plan.prefix), len(plan.recursions[0])
    r = (e - start) // per if e >= start else None
    return r if r is not None and r < len(plan.recursions) else None


def design_fractions(cfg) -> list[float] | None:
    """Share of the tokens each recursion is designed to keep (module docstring), or None for
    models without routers (every token runs every recursion)."""
    if cfg.variant != "mor":
        return None
    return router_kind(cfg.router.type).design_fractions(cfg.num_recursions, cfg.router)  # token-choice: balanced


def cache_layout(cfg, plan, producers: tuple[int, ...], max_len: int, sizing: str = "full") -> list[SlotSpec]:
    """One ``SlotSpec`` per effective layer of ``plan.order`` (module docstring)."""
    if sizing not in SIZINGS:
        raise ValueError(f"sizing={sizing!r}; choose 'full' or 'capacity'")
    fracs = design_fractions(cfg) if sizing == "capacity" else None

    def size(e: int) -> int:
        r = recursion_of(plan, e) if fracs is not None else None
        # ceil whatever the model's rounding: never below what the top-k keeps under either
        return max_len if r is None else tokens_kept(max_len, fracs[r], "ceil")

    specs = []
    for e, p in enumerate(producers):
        if p == e:
            specs.append(SlotSpec("own", e, size(e)))
        elif cfg.kv == "shared_dagger":
            specs.append(SlotSpec("dagger", p, size(p)))
        else:
            specs.append(SlotSpec("shared", p, 0))
    return specs


def entries_per_sequence(specs: list[SlotSpec]) -> int:
    """Token entries one sequence's cache holds, summed over the storing layers."""
    return sum(s.size for s in specs if s.kind != "shared")


def blocks_per_sequence(specs: list[SlotSpec], block_size: int) -> int:
    """Paged blocks of ``block_size`` entries one sequence's cache takes: each storing layer's
    entries rounded up to whole blocks (a block belongs to one sequence and one layer)."""
    return sum(-(-s.size // block_size) for s in specs if s.kind != "shared")
