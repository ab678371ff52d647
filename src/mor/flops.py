"""Parameter counts and FLOPs as pure functions (no torch), shared by logs, isoFLOP planning
and the throughput memory model.

Derivation (PaLM, Chowdhery et al. 2022, App. B; nanoGPT ``estimate_mfu``): a matmul with a
weight of P parameters costs 2P FLOPs per token forward and 4P backward, so 6P per trained
token. Attention adds, per layer and token, 2*T*d for QK^T and 2*T*d for AV forward
(x3 for training): 12*d*T per layer per token, counting the full T like PaLM (no causal
halving). For a recursion that only a fraction c of the tokens enters (MoR expert-choice,
capacity c), the matmul term scales by c and the attention term by c^2 (c*T queries each
attending to c*T keys), matching PAPER.md's (k/N_ctx)^2 for recursion-wise caching.

Token-choice routing has no fixed capacities: how many tokens reach recursion r depends on
what the router learns. FLOPs assume the balanced assignment the balancing loss / bias aim
for (1/Nr of the tokens per depth), so the fraction reaching recursion r is (Nr-r+1)/Nr
(r = 1..Nr): the same numbers as the hierarchical expert-choice capacities.

Recursive KV sharing (``model.kv`` shared / shared_dagger), for recursions r > 1: the c*T
active queries attend to all T keys of recursion 1, so attention scales by c, not c^2
(PAPER.md's cost table). 'shared' also skips the K and V projections there (the keys and
values are recursion 1's); 'shared_dagger' recomputes them for the active tokens. Vanilla
KV sharing (Table 15) skips the K and V projections of every layer that reads another
layer's cache (``mor.model.tying.kv_producers``); its attention is unchanged.

Relaxations (Table 16) add their per-token work to every recursion-layer call
(``relaxation_flops_per_token``): low-rank deltas and prefix attention.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mor.capacity import capacities
from mor.config import ModelConfig, ScaleShape
from mor.model.kv_layout import SlotSpec, blocks_per_sequence, cache_layout, design_fractions, entries_per_sequence
from mor.model.routers.registry import router_arch, router_kind
from mor.model.tying import TyingPlan, kv_producers, kv_unused, model_plan


def layer_params(s: ScaleShape) -> int:
    """One decoder layer: q,k,v,o projections + SwiGLU (3 matrices) + 2 RMSNorm gains."""
    kv = s.kv_heads * s.head_dim
    attn = s.hidden * s.hidden * 2 + s.hidden * kv * 2  # q, o: C*C; k, v: C*kv
    mlp = 3 * s.hidden * s.mlp
    return attn + mlp + 2 * s.hidden


def router_params(cfg: ModelConfig, s: ScaleShape) -> int:
    if cfg.variant != "mor":
        return 0
    r = cfg.router
    n_heads, out = router_kind(r.type).heads(cfg.num_recursions, r)  # e.g. expert-choice: Nr (x2 aux router) of 1
    return n_heads * router_arch(r.arch).params(s.hidden, out) + _router_bias_params(cfg)


def _router_bias_params(cfg: ModelConfig) -> int:
    """Router parameters no matmul reads (token-choice loss-free balancing: its Nr selection biases)."""
    return router_kind(cfg.router.type).frozen_params(cfg.num_recursions, cfg.router)


def _routes_per_recursion(cfg: ModelConfig) -> bool:
    """A MoR router kind that runs a router at every recursion (expert-choice); the others
    run theirs once, before recursion 1 (token-choice)."""
    return cfg.variant == "mor" and router_kind(cfg.router.type).per_recursion


@dataclass(frozen=True)
class Counting:
    """Everything the counts below read of a model config at a depth, derived once: the tying
    plan the built model holds (``model.plan``), each effective layer's KV producer
    (``model.kv_producers``), the K/V projections built but never run (``kv_unused``), and the
    design share of tokens reaching each recursion. One place asks the model layer for them
    (``counting``), so a count never re-derives the plan, and every count agrees on it."""

    plan: TyingPlan
    producers: tuple[int, ...]
    unused_layers: frozenset[int]  # unique layers whose K/V projections never run
    no_kv_slots: frozenset[tuple[int, int]]  # (unique layer, recursion) slots that run no k/v delta
    shares: tuple[float, ...]  # per recursion: the design share of tokens reaching it


def plan_for(cfg: ModelConfig, s: ScaleShape) -> TyingPlan:
    """The model's tying plan (``mor.model.tying.model_plan``; ``model.layers`` honoured), the
    one the built model holds as ``model.plan`` (``counting``'s)."""
    return counting(cfg, s.layers).plan


@functools.lru_cache(maxsize=4096)
def counting(cfg: ModelConfig, layers: int) -> Counting:
    """``Counting`` of ``cfg`` at a scale of ``layers`` layers. Cached per (config, depth): every
    count asks for it, a grid's planning asks for thousands of runs, and the result is frozen.
    Shares: ``mor.model.kv_layout.design_fractions`` (expert-choice capacities; token-choice the
    balanced assignment, module docstring); every layer call for a model without routers."""
    plan = model_plan(cfg, layers)
    producers = kv_producers(plan, cfg.kv, cfg.variant, cfg.tying, cfg.num_recursions)
    unused_layers, no_kv = kv_unused(plan, producers, cfg.kv)
    shares = design_fractions(cfg) or [1.0] * len(plan.recursions)
    return Counting(plan, producers, frozenset(unused_layers), frozenset(no_kv), tuple(shares))


def param_count(cfg: ModelConfig, s: ScaleShape, vocab: int) -> int:
    """Unique parameters the model runs: tied embedding/head once, each unique layer once,
    final norm; minus the K/V projections of layers that only read shared KV
    (``mor.model.tying.kv_unused``: built, never run, no gradient)."""
    c = counting(cfg, s.layers)
    kv_proj = 2 * s.hidden * s.kv_heads * s.head_dim
    return (vocab * s.hidden + c.plan.num_unique * layer_params(s) - len(c.unused_layers) * kv_proj + s.hidden
            + router_params(cfg, s) + relaxation_params(cfg, s))


def relaxation_params(cfg: ModelConfig, s: ScaleShape) -> int:
    """Per-recursion parameters of a relaxation (mor.model.relax), counted per slot = each
    distinct (unique layer, recursion) pair the plan's recursions run.

    LoRA: rank * (in + out) for each of q, k, v, o, gate, up, down: rank * (9C + 2 kv + 3M)
    (q, o: C + C; k, v: C + kv; gate, up, down: C + M). DoRA adds one magnitude per output
    row: 3C + 2 kv + 2M. Prefix: P keys + P values per KV head: 2 P kv. Recursion PE: C per
    recursion (not per slot).
    """
    if cfg.relaxation == "none":
        return 0
    c = counting(cfg, s.layers)
    plan = c.plan
    if cfg.relaxation == "recursion_pe":
        return len(plan.recursions) * s.hidden
    slots = len({(u, r) for r, rec in enumerate(plan.recursions) for u in rec})
    kv, C, M, rank = s.kv_heads * s.head_dim, s.hidden, s.mlp, cfg.relaxation_rank
    if cfg.relaxation == "prefix":
        return slots * 2 * rank * kv
    per_slot = rank * (9 * C + 2 * kv + 3 * M)
    kv_deltas = rank * 2 * (C + kv)  # the k_proj and v_proj deltas of a slot
    if cfg.relaxation == "dora":
        per_slot += 3 * C + 2 * kv + 2 * M
        kv_deltas += 2 * kv
    # slots whose layer calls all read shared KV never run their k/v deltas (tying.kv_unused)
    return slots * per_slot - len(c.no_kv_slots) * kv_deltas


def forward_flops_per_token(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int,
                            shares: tuple[float, ...] = ()) -> float:
    """Forward FLOPs per input token, averaged over the sequence (see module docstring): the
    unshared first/last layers, each recursion (``recursion_flops_per_token``, expert-choice
    routers included), a token-choice router (run once, before recursion 1) and the LM head."""
    plan = counting(cfg, s.layers).plan
    unrouted = len(plan.prefix) + len(plan.suffix)
    flops = unrouted * (2 * (layer_params(s) - 2 * s.hidden) + 4 * s.hidden * seq_len)
    flops += sum(recursion_flops_per_token(cfg, s, seq_len, shares))
    if not _routes_per_recursion(cfg):
        flops += 2 * (router_params(cfg, s) - _router_bias_params(cfg))  # token-choice (0 without routers)
    flops += 2 * s.hidden * vocab  # LM head
    return float(flops)


def relaxation_flops_per_token(cfg: ModelConfig, s: ScaleShape, reads_kv: bool = False) -> float:
    """Forward FLOPs a relaxation (mor.model.relax) adds to one recursion-layer call, per token.

    LoRA / DoRA: 2 * rank * (in + out) per relaxed projection (x -> A x -> B A x), i.e. twice
    the slot's low-rank parameters; a layer that reads shared KV (``reads_kv``) runs no k/v
    projection, so no k/v delta either. DoRA's row norm of W + s B A is computed once per
    layer call, not per token, and its gain is elementwise: neither is counted. Prefix: every
    query also attends over the P learned keys/values (QK^T and AV: 4 * C * P). Recursion PE
    is elementwise (not counted, like RMSNorm).
    """
    C, kv, M, rank = s.hidden, s.kv_heads * s.head_dim, s.mlp, cfg.relaxation_rank
    if cfg.relaxation in ("lora", "dora"):
        kv_deltas = 2 * (C + kv)  # k_proj and v_proj: in C, out kv
        return 2.0 * rank * (9 * C + 2 * kv + 3 * M - (kv_deltas if reads_kv else 0))
    if cfg.relaxation == "prefix":
        return 4.0 * C * rank
    return 0.0


def recursion_flops_per_token(cfg: ModelConfig, s: ScaleShape, seq_len: int, shares: tuple[float, ...] = ()) -> list[float]:
    """Forward FLOPs per input token of each recursion r = 1..Nr, averaged over the sequence:
    its layer calls (matmuls x the share c of tokens reaching it; attention x c^2, or x c
    where recursion r > 1 attends to all keys under recursive KV sharing; relaxations; no K/V
    projections in a layer reading another layer's keys/values), plus, for expert-choice
    MoR, its own router (one of the Nr router heads). The one count of a recursion's cost:
    ``forward_flops_per_token`` sums these. ``shares``: the tokens reaching each recursion
    as measured (either router type) instead of the design's."""
    c = counting(cfg, s.layers)
    plan, producers = c.plan, c.producers
    per_layer_mm = 2 * (layer_params(s) - 2 * s.hidden)
    per_layer_attn = 4 * s.hidden * seq_len
    fracs = list(shares) if shares else list(c.shares)
    per_recursion = _routes_per_recursion(cfg)  # expert-choice: one router head per recursion
    router = 2 * (router_params(cfg, s) - _router_bias_params(cfg)) / len(plan.recursions) if per_recursion else 0.0
    kv_proj_mm = 2 * 2 * s.hidden * s.kv_heads * s.head_dim  # K and V projections, forward
    e = len(plan.prefix)  # effective index of the next layer
    out = []
    for r, (frac, rec) in enumerate(zip(fracs, plan.recursions)):
        flops = router
        for _ in rec:
            reads_kv = cfg.kv == "shared" and producers[e] != e
            mm = per_layer_mm - kv_proj_mm if reads_kv else per_layer_mm
            attn = frac if r > 0 and cfg.kv != "recursion_wise" else frac * frac
            flops += frac * (mm + relaxation_flops_per_token(cfg, s, reads_kv)) + attn * per_layer_attn
            e += 1
        out.append(float(flops))
    return out


def capped_forward_flops_per_token(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int,
                                   max_depth: int) -> float:
    """Forward FLOPs per input token with the recursion depth capped at ``max_depth``
    (``model(x, max_depth=d)``, the analysis job's depth_cap, Fig. 5c): recursions beyond d
    (and their expert-choice routers) are skipped; the shares of tokens reaching 1..d, the
    unshared layers and the LM head are those of the full forward. d = Nr gives
    ``forward_flops_per_token``."""
    rec = recursion_flops_per_token(cfg, s, seq_len)
    if not 1 <= max_depth <= len(rec):
        raise ValueError(f"max_depth must lie in 1..{len(rec)}, got {max_depth}")
    return forward_flops_per_token(cfg, s, vocab, seq_len) - sum(rec[max_depth:])


def train_flops(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int, tokens: int) -> float:
    """Training FLOPs: forward + backward (2x forward) over ``tokens`` tokens."""
    return 3.0 * forward_flops_per_token(cfg, s, vocab, seq_len) * tokens


def tokens_for_budget(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int, flops: float) -> int:
    """Training tokens that spend ``flops`` (isoFLOP planning)."""
    return int(flops / (3.0 * forward_flops_per_token(cfg, s, vocab, seq_len)))


# --------------------------------------------------------------------------------------
# KV cache memory (PAPER.md cost table; App. E maximum batch)
# --------------------------------------------------------------------------------------
def kv_memory_fraction(strategy: str, num_recursions: int, capacity: tuple[float, ...] = ()) -> float:
    """KV-cache memory of a recursion stack relative to a vanilla stack of equal depth.

    Recursion r caches the share c_r of the tokens routed to it; every recursion has the
    same number of layers. recursion_wise: mean_r c_r, = (Nr+1)/(2Nr) for the hierarchical
    c_r = (Nr-r)/Nr. shared: only recursion 1 stores KV: c_1/Nr, = 1/Nr.
    """
    caps = capacities(num_recursions, capacity)
    if strategy == "recursion_wise":
        return sum(caps) / num_recursions
    if strategy == "shared":
        return caps[0] / num_recursions
    raise ValueError(f"kv memory fraction is defined for 'recursion_wise' and 'shared', got {strategy!r}")


def kv_io_fraction(strategy: str, num_recursions: int, capacity: tuple[float, ...] = ()) -> float:
    """KV-cache reads per decoding step relative to vanilla (PAPER.md): each recursion reads
    its whole cache once. recursion_wise: mean_r c_r = (Nr+1)/(2Nr); shared: every recursion
    reads recursion 1's cache, c_1 = 1."""
    caps = capacities(num_recursions, capacity)
    if strategy == "recursion_wise":
        return sum(caps) / num_recursions
    if strategy == "shared":
        return caps[0]
    raise ValueError(f"kv IO fraction is defined for 'recursion_wise' and 'shared', got {strategy!r}")


def attention_flops_fraction(strategy: str, active_fraction: float) -> float:
    """Attention FLOPs of a recursion where k of N_ctx tokens are active, relative to all N_ctx:
    recursion_wise (k/N)^2 (k queries over k cached keys); shared k/N (k queries over all N)."""
    if not 0 <= active_fraction <= 1:
        raise ValueError(f"active_fraction must lie in [0, 1], got {active_fraction}")
    if strategy == "recursion_wise":
        return active_fraction**2
    if strategy == "shared":
        return active_fraction
    raise ValueError(f"attention FLOPs fraction is defined for 'recursion_wise' and 'shared', got {strategy!r}")


def relative_max_batch(num_recursions: int, base_batch: int = 32, strategy: str = "recursion_wise",
                       capacity: tuple[float, ...] = ()) -> float:
    """App. E's relative maximum batch: ``base_batch`` scaled by 1 / KV memory fraction, i.e.
    32 * 2Nr/(Nr+1) = 42.7, 48, 51.2 for Nr = 2, 3, 4 (the seed's 42 / 48 / 51), the whole
    model's memory treated as KV cache (parameters and unshared layers neglected)."""
    return base_batch / kv_memory_fraction(strategy, num_recursions, capacity)


def kv_cache_entries(cfg: ModelConfig, s: ScaleShape, max_len: int, sizing: str = "capacity") -> int:
    """Token entries one sequence's KV cache holds, summed over layers: the layout of
    ``mor.model.kv_layout.cache_layout`` (the one the caches allocate by). A layer that reads
    another layer's KV (``model.kv`` shared) stores none; a dagger layer mirrors its
    producer. sizing 'capacity': recursion r holds its design share of max_len (expert-choice
    capacities; token-choice the balanced assignment); 'full': every layer max_len."""
    return entries_per_sequence(layout_for(cfg, s, max_len, sizing))


def layout_for(cfg: ModelConfig, s: ScaleShape, max_len: int, sizing: str = "capacity") -> list[SlotSpec]:
    """The KV layout (``mor.model.kv_layout.cache_layout``) of ``plan_for``'s plan: what a built
    model's ``cache_layout(cfg, model.plan, model.kv_producers, ...)`` gives, without the model."""
    c = counting(cfg, s.layers)
    return cache_layout(cfg, c.plan, c.producers, max_len, sizing)


def kv_cache_bytes(cfg: ModelConfig, s: ScaleShape, batch: int, max_len: int, bytes_per_elem: int = 2,
                   sizing: str = "capacity") -> int:
    """Bytes of keys and values: entries x batch x 2 (K, V) x kv_heads x head_dim x bytes."""
    return kv_cache_entries(cfg, s, max_len, sizing) * batch * kv_entry_bytes(s, bytes_per_elem)


def kv_entry_bytes(s: ScaleShape, bytes_per_elem: int = 2) -> int:
    """One token's keys and values at one layer: 2 (K, V) x kv_heads x head_dim x bytes."""
    return 2 * s.kv_heads * s.head_dim * bytes_per_elem


def kv_cache_blocks(cfg: ModelConfig, s: ScaleShape, max_len: int, block_size: int, sizing: str = "capacity") -> int:
    """Paged blocks of ``block_size`` entries one sequence's KV takes: each storing layer's
    entries (``kv_cache_entries``' layout) rounded up to whole blocks, as the engine's block
    manager allocates them (a block belongs to one sequence and one layer)."""
    return blocks_per_sequence(layout_for(cfg, s, max_len, sizing), block_size)


def model_bytes(cfg: ModelConfig, s: ScaleShape, vocab: int, bytes_per_elem: int = 2) -> int:
    """Parameter memory at inference (the unique parameters, in the serving dtype)."""
    return param_count(cfg, s, vocab) * bytes_per_elem


def max_batch(cfg: ModelConfig, s: ScaleShape, vocab: int, max_len: int, memory_bytes: float,
              bytes_per_elem: int = 2, block_size: int | None = None, layout: list[SlotSpec] | None = None) -> int:
    """App. E's maximum decoding batch, exactly: how many sequences of ``max_len`` tokens fit
    their KV cache (``kv_cache_bytes``, capacity-sized: recursion r of a MoR model holds its
    design share c_r of the positions; shared KV stores recursion 1's only; unshared first and
    last layers hold every position) beside the parameters (``model_bytes``) in
    ``memory_bytes``. Activations of the current position are neglected, as App. E does.

    This is also the engine's admission limit (mor.engine.Engine with ``memory_bytes``: it
    admits at most this many live sequences and pages their KV as the routers route it, so a
    router that keeps more than its design share makes the engine wait or preempt, never
    overflow).

    ``block_size``: count what a paged cache of such blocks holds instead, each sequence's
    layers rounded up to whole blocks (``kv_cache_blocks``), so that admitting this many
    sequences into ``(memory_bytes - parameters) // block bytes`` blocks never overruns the
    pool while the routers keep their design shares (the engine's admission limit; App. E's
    number is the exact count, ``block_size=None``).

    ``layout``: the model's capacity-sized KV layout when the caller holds the built model
    (the engine: ``cache_layout(cfg, model.plan, model.kv_producers, max_len, "capacity")``),
    so the plan is not rebuilt; by default ``layout_for``'s."""
    layout = layout_for(cfg, s, max_len, "capacity") if layout is None else layout
    free = memory_bytes - model_bytes(cfg, s, vocab, bytes_per_elem)
    if free <= 0:
        return 0
    if block_size is not None:
        block_bytes = block_size * kv_entry_bytes(s, bytes_per_elem)
        return int((free // block_bytes) // blocks_per_sequence(layout, block_size))
    return int(free // (entries_per_sequence(layout) * kv_entry_bytes(s, bytes_per_elem)))


def relative_max_batch_exact(cfg: ModelConfig, vanilla: ModelConfig, s: ScaleShape, vocab: int, max_len: int,
                             memory_bytes: float, base_batch: int = 32, bytes_per_elem: int = 2) -> float:
    """App. E's relative maximum batch from ``max_batch``: base_batch x the model's maximum
    batch / the vanilla baseline's (for MoR-4 at 360M a 34-layer vanilla, model.layers: 34)."""
    ref = max_batch(vanilla, s, vocab, max_len, memory_bytes, bytes_per_elem)
    if ref < 1:
        raise ValueError(f"the vanilla baseline does not fit {memory_bytes / 2**30:.1f} GiB at max_len {max_len}")
    return base_batch * max_batch(cfg, s, vocab, max_len, memory_bytes, bytes_per_elem) / ref


def decode_flops_per_token(cfg: ModelConfig, s: ScaleShape, vocab: int, context_len: float,
                           shares: tuple[float, ...] = ()) -> float:
    """Forward FLOPs of generating one token with ``context_len`` cached positions.

    The per-token matmuls are the training forward's (each recursion weighted by the share
    of tokens reaching it), and a token attends over the keys its layers cache: c_r of the
    context at recursion r with recursion-wise caching (a fraction c_r of the tokens each
    attending to c_r x context: c_r^2, as in training), all of recursion 1's with KV sharing
    (c_r). That is ``forward_flops_per_token`` with the sequence length replaced by the
    context length; for a generation of n tokens from an empty prefix the mean context is
    about n / 2. The ratio of two models' values is the FLOPs-predicted decoding speedup.
    """
    return forward_flops_per_token(cfg, s, vocab, max(1, round(context_len)), shares)
