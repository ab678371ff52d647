"""Training memory per GPU as pure functions (no torch): what a run needs at a micro-batch.

Feeds the plan (the micro-batch each run gets on a preset's GPU, and a warning where none
fits), the train job's ``execution.micro_batch: auto`` and ``benchmarks/device_check.py``
(model vs ``torch.cuda.max_memory_allocated``). Byte counts per GPU, in five parts:

* **static** (for the whole run): fp32 parameters 4P, fp32 gradients 4P, AdamW's two fp32
  moments 8P (Rajbhandari et al. 2020, ZeRO, Sec. 3.1: 16P for mixed-precision Adam without
  the fp32 master copy, which we do not keep: the parameters themselves are fp32). DDP adds
  its gradient buckets (4P; ``gradient_as_bucket_view`` is off). FSDP over N GPUs divides
  parameters, gradients and moments by N and holds the unsharded fp32 weights of the
  embedding and of two layers (the one running and the one prefetched).
* **weight casts**: under bf16 autocast each weight matrix is cast once per forward and the
  cast is cached until the forward ends (2 bytes per matrix parameter, unsharded).
* **activations**: what autograd saves for backward, per token of a layer call (C hidden,
  Ckv = kv_heads x head_dim, M mlp width, H heads; a = 2 bytes in bf16, 4 in fp32)::

      fp32 residual stream and norms: input, normed output (x2 norms) 16C + rsqrt 8
      attention: q C, k and v 2Ckv, output C, its logsumexp 4H (fp32)
      linear inputs: bf16 casts of the normed input per projection (q, k, v, gate, up: 5C);
                     in fp32 the projections share it (2 reshaped copies: 2C)
      SwiGLU: gate and up outputs, silu(gate), their product: 4M
      RoPE tables looked up per call: (2 fp32 | 4 bf16) x head_dim per position of a sequence

  so ``a (7C + 2Ckv + 4M) + 16C + 4H + 8`` in bf16 (the counts were read off
  ``torch.autograd.graph.saved_tensors_hooks`` on one Block; ``tests/unit/test_memory.py`` holds
  the whole model to them). A MoR recursion that keeps a fraction c of the tokens runs its
  layers on cT tokens and adds the gathered rows and the gated update, (2C + 8) x 4 bytes per
  kept token (token-choice, routed once: (C + 8) x 4). With activation checkpointing a layer call keeps only its fp32 input (4C), and
  backward recomputes one layer call's activations at a time.
* **logits**: the head's output for every position: a kept in the output, the fp32
  log-softmax 4 saved, and in backward its gradient and the fp32 logits' gradient 4 + 4, per
  vocabulary entry. The chunked loss (``execution.loss_chunk``) holds that for one chunk.
* **reserve**: CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation: the fits
  use 90% of the GPU's memory minus 1.5 GiB (an assumption until ``device_check.py`` has
  measured it).

Peak = static + weight casts + activations + logits (+ one layer's recompute with
checkpointing): everything saved is alive when backward starts, and the logits' gradients
are the first thing backward makes. Not modelled: KV-sharing variants (counted like
recursion-wise), relaxation deltas' activations, the router's small per-token tensors beyond
8 floats per recursion; they are within the tolerance the tests hold the model to.
"""

from __future__ import annotations

from dataclasses import dataclass

from mor.config import ModelConfig, RunConfig, ScaleShape, model_shape
from mor.flops import counting, layer_params, param_count
from mor.model.routers.registry import router_kind

GiB = 1024**3
RESERVE_FRACTION = 0.90  # of the GPU's memory, the rest left to fragmentation
RESERVE_BYTES = 1.5 * GiB  # CUDA context, cuBLAS / NCCL workspaces
PARALLEL = ("ddp", "fsdp")
DTYPES = {"bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of one training step at one micro-batch (see the module docstring)."""

    params: float
    grads: float
    optimizer: float
    buffers: float  # DDP gradient buckets, or FSDP's unsharded layers
    weight_casts: float
    activations: float
    logits: float
    recompute: float  # one layer call's activations, rebuilt in backward (checkpointing)

    @property
    def static(self) -> float:
        return self.params + self.grads + self.optimizer + self.buffers

    @property
    def total(self) -> float:
        return self.static + self.weight_casts + self.activations + self.logits + self.recompute

    def gib(self) -> dict[str, float]:
        """Every part and the total in GiB, rounded for a table."""
        parts = {k: getattr(self, k) for k in ("params", "grads", "optimizer", "buffers", "weight_casts",
                                               "activations", "logits", "recompute", "total")}
        return {k: round(v / GiB, 2) for k, v in parts.items()}


def layer_activation_bytes(s: ScaleShape, compute_bytes: int) -> float:
    """Bytes autograd saves per token of one layer call (module docstring), RoPE tables aside."""
    C, kv, M, H = s.hidden, s.kv_heads * s.head_dim, s.mlp, s.heads
    copies = 5 if compute_bytes == 2 else 2  # bf16: one cast per projection; fp32: 2 reshaped copies
    return compute_bytes * ((copies + 2) * C + 2 * kv + 4 * M) + 16 * C + 4 * H + 8


def rope_bytes_per_token(s: ScaleShape, compute_bytes: int, micro_batch: int) -> float:
    """The RoPE tables one layer call looks up: (1, 1, T, head_dim) each, shared by the batch."""
    tables = 4 if compute_bytes == 2 else 2
    return tables * s.head_dim * compute_bytes / micro_batch


def layer_call_fractions(cfg: ModelConfig, s: ScaleShape) -> tuple[list[float], list[float]]:
    """Per layer call in forward order, the fraction of the sequence it runs on; and per
    routed recursion the fraction kept (MoR only, else empty): the plan and design shares every
    count reads (``mor.flops.counting``), so memory and FLOPs size the same recursions."""
    c = counting(cfg, s.layers)
    plan = c.plan
    caps = list(c.shares) if cfg.variant == "mor" else []
    calls = [1.0] * len(plan.prefix)
    for r, rec in enumerate(plan.recursions):
        calls += [caps[r] if caps else 1.0] * len(rec)
    calls += [1.0] * len(plan.suffix)
    return calls, caps


def activation_bytes(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int, micro_batch: int,
                     compute_bytes: int = 2, checkpointing: bool = False, loss_chunk: int = 0) -> dict[str, float]:
    """Saved activations, the logits' peak and the recompute of one micro-batch, in bytes."""
    tokens = micro_batch * seq_len
    calls, caps = layer_call_fractions(cfg, s)
    per_call = layer_activation_bytes(s, compute_bytes) + rope_bytes_per_token(s, compute_bytes, micro_batch)
    C = s.hidden
    # per kept token of a routed recursion, the router kind's: expert-choice gathers the rows and
    # writes back the gated update (2C + 8 fp32); token-choice routes once and keeps one row copy (C + 8)
    rows_kept = router_kind(cfg.router.type).kept_row_bytes(C)
    routed = sum(rows_kept * 4 * c for c in caps)
    # outside the layers: token ids and targets (int64), the final norm's input, rsqrt, output
    head_in = 16 + 3 * 4 * C + 4
    if checkpointing:
        saved = (4 * C * sum(calls) + routed + head_in) * tokens
        recompute = (per_call - 4 * C) * tokens  # one layer call's activations, rebuilt in backward
    else:
        saved = (per_call * sum(calls) + routed + head_in) * tokens
        recompute = 0.0
    rows = min(loss_chunk, tokens) if loss_chunk else tokens
    logits = rows * vocab * (compute_bytes + 4 + 4 + 4)  # kept, log-softmax, two gradients in backward
    if not loss_chunk:
        saved += tokens * vocab * 4  # the log-softmax is saved for the whole micro-batch ...
        logits -= tokens * vocab * 4  # ... and counted once
    return {"activations": saved, "logits": logits, "recompute": recompute}


def training_memory(cfg: ModelConfig, s: ScaleShape, vocab: int, seq_len: int, micro_batch: int,
                    dtype: str = "bf16", world: int = 1, parallel: str = "ddp", checkpointing: bool = False,
                    loss_chunk: int = 0) -> MemoryEstimate:
    """Peak bytes on one of ``world`` GPUs training ``cfg`` at ``micro_batch`` sequences a pass."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; choose one of {sorted(DTYPES)}")
    if parallel not in PARALLEL:
        raise ValueError(f"parallel={parallel!r}; choose one of {list(PARALLEL)}")
    P = param_count(cfg, s, vocab)
    shard = world if parallel == "fsdp" else 1
    if parallel == "fsdp" and world > 1:
        buffers = (vocab * s.hidden + 2 * layer_params(s)) * 4  # unsharded embedding + 2 layers
    elif world > 1:
        buffers = 4 * P  # DDP's gradient buckets
    else:
        buffers = 0.0
    a = DTYPES[dtype]
    casts = 2 * P if a == 2 else 0.0
    act = activation_bytes(cfg, s, vocab, seq_len, micro_batch, a, checkpointing, loss_chunk)
    return MemoryEstimate(params=4 * P / shard, grads=4 * P / shard, optimizer=8 * P / shard, buffers=buffers,
                          weight_casts=casts, **act)


def usable_bytes(gpu_bytes: float) -> float:
    """What the fits may use of a GPU's memory (module docstring: reserve)."""
    return gpu_bytes * RESERVE_FRACTION - RESERVE_BYTES


@dataclass(frozen=True)
class Fit:
    """The micro-batch picked for one run on one GPU, and whether it fits at all."""

    micro_batch: int
    estimate: MemoryEstimate
    fits: bool
    usable: float  # bytes the fit was allowed

    def describe(self) -> str:
        need = self.estimate.total / GiB
        if self.fits:
            return f"micro-batch {self.micro_batch} ({need:.1f} of {self.usable / GiB:.0f} GiB)"
        return f"DOES NOT FIT: {need:.1f} GiB at micro-batch 1 > {self.usable / GiB:.0f} GiB usable"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def pick_micro_batch(run: RunConfig, vocab: int, gpu_bytes: float, world: int = 1, parallel: str = "ddp",
                     execution=None, dtype: str = "bf16") -> Fit:
    """The largest divisor of the per-rank batch whose peak fits ``usable_bytes(gpu_bytes)``,
    with the run's execution settings (checkpointing, loss chunk); micro-batch 1 with
    ``fits=False`` when even that does not fit."""
    t = run.train
    shape = model_shape(run.model)
    vocab = shape.vocab or vocab
    per_rank = max(1, t.global_batch // world)
    ckpt = bool(execution and execution.activation_checkpointing)
    chunk = execution.loss_chunk if execution else 0
    usable = usable_bytes(gpu_bytes)
    best = None
    for mb in divisors(per_rank):
        est = training_memory(run.model, shape, vocab, t.seq_len, mb, dtype, world, parallel, ckpt, chunk)
        if est.total <= usable:
            best = Fit(mb, est, True, usable)
        else:
            break  # memory grows with the micro-batch
    if best is None:
        est = training_memory(run.model, shape, vocab, t.seq_len, 1, dtype, world, parallel, ckpt, chunk)
        best = Fit(1, est, False, usable)
    return best
