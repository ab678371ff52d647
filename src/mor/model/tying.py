"""Which unique layer each effective layer uses, for the four weight-tying schemes.

Pure and torch-free so tests, FLOP counts and the grid expander share it. Notation: an
effective depth of L layers run as Nr recursions of one shared block.

    Cycle           1,2,3,1,2,3,...        block of L/Nr layers repeated
    Sequence        1,1,2,2,3,3,...        each layer repeated Nr times in a row
    Middle-Cycle    0 | Cycle | last       first and last layer unshared
    Middle-Sequence 0 | Sequence | last

A recursion is a consecutive chunk of L_shared/Nr effective layers of the shared part, so
"recursion r" is well defined for every scheme (the router picks tokens per chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

from mor.depth import floor_depth

SCHEMES = ("cycle", "sequence", "middle_cycle", "middle_sequence")


def effective_depth(scheme: str, layers: int, num_recursions: int) -> int:
    """The depth a ``layers``-layer scale runs as ``num_recursions`` recursions: the authors'
    floor rule (``mor.depth.floor_depth``), floor((L - unshared) / Nr) layers per recursion, the
    rest dropped. Extra layers only through ``model.layers`` where the paper adds them (MoR-4 at
    360M: 34 layers, 1 + 8x4 + 1, App. E). Before issue 55 this padded up (``mor.depth.padded_depth``).
    """
    _check(scheme, num_recursions)
    return floor_depth(scheme, layers, num_recursions)


@dataclass(frozen=True)
class TyingPlan:
    """Unique-layer indices of the unshared prefix, each recursion and the unshared suffix."""

    prefix: tuple[int, ...]
    recursions: tuple[tuple[int, ...], ...]
    suffix: tuple[int, ...]

    @property
    def order(self) -> list[int]:
        return [*self.prefix, *(i for rec in self.recursions for i in rec), *self.suffix]

    @property
    def num_unique(self) -> int:
        return len(set(self.order))


def tying_plan(scheme: str, depth: int, num_recursions: int) -> TyingPlan:
    """Split an effective depth into prefix / Nr recursions / suffix of unique-layer ids."""
    _check(scheme, num_recursions)
    middle = scheme.startswith("middle")
    shared = depth - 2 if middle else depth
    if shared < num_recursions or shared % num_recursions:
        raise ValueError(
            f"tying {scheme!r}: {shared} shared layers cannot form {num_recursions} recursions; "
            f"use effective_depth() for a depth it can split (got depth={depth})"
        )
    per = shared // num_recursions  # unique layers in the shared block
    offset = 1 if middle else 0
    if scheme.endswith("cycle"):
        body = [offset + i % per for i in range(shared)]
    else:
        body = [offset + i // num_recursions for i in range(shared)]
    recs = tuple(tuple(body[r * per : (r + 1) * per]) for r in range(num_recursions))
    if middle:
        return TyingPlan(prefix=(0,), recursions=recs, suffix=(per + 1,))
    return TyingPlan(prefix=(), recursions=recs, suffix=())


def vanilla_plan(depth: int) -> TyingPlan:
    """An untied stack: one 'recursion' holding every layer once."""
    return TyingPlan(prefix=(), recursions=(tuple(range(depth)),), suffix=())


def model_plan(cfg, scale_layers: int) -> TyingPlan:
    """The tying plan of a model config (``mor.config.ModelConfig``) at a scale of
    ``scale_layers`` layers: the one place the depth is decided (``model.layers`` overrides
    the scale's; reduced vanilla takes a Cycle model's unique-layer count; recursive and
    MoR take the authors' floor depth, ``effective_depth``). The model, FLOP counts and KV sizing call it."""
    layers = cfg.layers or scale_layers
    if cfg.variant == "vanilla":
        return vanilla_plan(reduced_depth(layers, cfg.num_recursions) if cfg.reduced else layers)
    return tying_plan(cfg.tying, effective_depth(cfg.tying, layers, cfg.num_recursions), cfg.num_recursions)


def reduced_depth(layers: int, num_recursions: int) -> int:
    """Depth of the 'reduced' vanilla baseline: the unique layers of a Cycle model, floor(L / Nr)
    (the authors' floor rule; 11 for 32 layers at Nr 3 before issue 55, now 10)."""
    return effective_depth("cycle", layers, num_recursions) // num_recursions


def _check(scheme: str, num_recursions: int) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tying scheme {scheme!r}; choose one of {list(SCHEMES)}")
    if num_recursions < 1:
        raise ValueError(f"num_recursions must be >= 1, got {num_recursions}")


def kv_producers(plan: TyingPlan, kv: str, variant: str, pattern: str, num_recursions: int) -> tuple[int, ...]:
    """For each effective layer (an index into ``plan.order``), the effective layer whose
    keys/values its attention reads. A layer that maps to itself computes its own.

    recursion_wise   every layer its own KV (no sharing).
    recursive / MoR  ``shared`` and ``shared_dagger``: recursion r > 1 reads the KV that the
                     layer at the SAME POSITION of recursion 1 computed (PAPER.md "every
                     recursion reuses the KV pairs of the first recursion"); the unshared
                     prefix/suffix layers keep their own. For Cycle tying that layer is
                     also the same unique layer; for Sequence tying it is not (position j
                     of recursion 1 is another unique layer), which is the rule the
                     token-choice path uses too.
    vanilla          ``shared``: adjacent layers share KV in groups of ``num_recursions``
                     (2, i.e. layer pairs as in cross-layer attention, when it is 1),
                     laid out like the tying schemes (Table 15 "Vanilla" rows):
                     cycle    layer i reads layer i mod P, P = ceil(n / group)
                     sequence layer i reads layer group * (i // group)
                     middle_* the same over the middle layers; first and last unshared.
    """
    n = len(plan.order)
    own = tuple(range(n))
    if kv == "recursion_wise":
        return own
    if kv not in ("shared", "shared_dagger"):
        raise ValueError(f"unknown KV strategy {kv!r}")
    if variant != "vanilla":
        start, per = len(plan.prefix), len(plan.recursions[0])
        out = list(own)
        for e in range(start + per, start + per * len(plan.recursions)):
            out[e] = start + (e - start) % per
        return tuple(out)
    if kv == "shared_dagger":
        raise ValueError("kv='shared_dagger' needs routing (variant 'mor'): without it every token is active")
    if pattern not in SCHEMES:
        raise ValueError(f"unknown KV sharing pattern {pattern!r}; choose one of {list(SCHEMES)}")
    group = num_recursions if num_recursions > 1 else 2
    lo, hi = (1, n - 1) if pattern.startswith("middle") else (0, n)
    body = hi - lo
    if body < 1:
        return own
    out = list(own)
    blocks = -(-body // group)  # ceil: layers in the Cycle block that compute KV
    for i in range(body):
        out[lo + i] = lo + (i % blocks if pattern.endswith("cycle") else group * (i // group))
    return tuple(out)


def kv_unused(plan: TyingPlan, producers: tuple[int, ...], kv: str) -> tuple[frozenset[int], frozenset[tuple[int, int]]]:
    """Which K/V projections a model builds but never runs, under KV strategy ``kv``.

    With ``kv: shared`` a layer that reads another layer's keys/values computes none of its
    own (``mor.flops`` does not count those FLOPs). A unique layer all of whose effective
    layers read KV therefore has k_proj / v_proj that receive no gradient (e.g. Sequence
    tying: the unique layers that appear only in recursions r > 1; vanilla KV sharing: every
    layer that reads its group's cache). Likewise a relaxation slot (unique layer,
    recursion) whose layer calls all read KV never runs its k/v deltas. ``shared_dagger``
    recomputes K/V for the active tokens, so nothing is unused there.

    Returns (unique layer ids without K/V use, (unique layer, recursion) slots without K/V
    use); both empty unless ``kv == 'shared'``. The parameter counts (model.num_params,
    mor.flops.param_count) leave these tensors out.
    """
    if kv != "shared":
        return frozenset(), frozenset()
    order = plan.order
    produces = {u: False for u in order}
    for e, u in enumerate(order):
        produces[u] |= producers[e] == e
    slots: dict[tuple[int, int], bool] = {}
    e = len(plan.prefix)
    for r, rec in enumerate(plan.recursions):
        for u in rec:
            slots[(u, r)] = slots.get((u, r), False) or producers[e] == e
            e += 1
    return (frozenset(u for u, p in produces.items() if not p),
            frozenset(s for s, p in slots.items() if not p))
