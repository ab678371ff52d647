"""Typed run configuration: model shape, variant, router, training and data.

Torch-free on purpose: the Snakefile, the grid expander, the tests and the report code
import it cheaply. Every dataclass validates itself in ``__post_init__`` and raises a
``ConfigError`` that names the bad field and the allowed values; ``from_dict`` rejects
unknown keys, so a typo in a grid fails before any job starts.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from mor.depth import depth_moved
from mor.identity import RETIRED_FIELDS, digest, eval_fields, training_fields
from mor.model.routers.registry import arch_names, kind_names, router_kind
from mor.yaml_io import YamlError, key_line, load_derived, where

SCALES_FILE = Path(__file__).resolve().parents[2] / "grids" / "scales.yaml"

Variant = Literal["vanilla", "recursive", "mor"]
Tying = Literal["cycle", "sequence", "middle_cycle", "middle_sequence"]
# model.router.type / .arch: the names registered in mor.model.routers.registry (one list)
RouterType = str
RouterFunc = Literal["sigmoid", "tanh", "softmax", "none"]
RouterArch = str
ExpertChoiceAux = Literal["aux_loss", "aux_router"]
Balancing = Literal["loss", "loss_free"]
Gating = Literal["weighted", "additive"]
KVStrategy = Literal["recursion_wise", "shared", "shared_dagger"]
Relaxation = Literal["none", "lora", "dora", "prefix", "recursion_pe"]
WeightInit = Literal["crn", "global_rng"]
DataOrder = Literal["sequence", "rank", "pass"]
TiedInit = Literal["stepwise", "average", "random", "upcycle"]
Combine = Literal["layer_output", "layer_update"]
CapacityRounding = Literal["floor", "ceil"]
ResidualInit = Literal["normal", "scaled"]
RecursionAttention = Literal["tied", "untied"]

# The authors' effective expert-choice BCE weight. Their trainer adds coeff x BCE to every
# micro-batch's loss without dividing it by the gradient-accumulation count G, while the LM
# loss is a mean that is divided by G: the gradient sees coeff x G against the LM loss.
# G = total_batch_size / (per_device_train_batch_size x GPUs) = 1024 / (16 x GPUs); the
# number of GPUs is not in their run configurations (scripts/pretrain.sh takes the GPU list on
# the command line). ASSUMPTION: 4 GPUs (G = 16), the num_processes of their
# acc_configs/default_config.yaml; 8 GPUs would give G = 8 (0.008), 1 GPU G = 64.
AUTHORS_AUX_COEFF = 0.001  # `mor.expert.coeff` in their 360M configurations
AUTHORS_GPUS = 4  # assumed (see above)
AUTHORS_GRAD_ACCUM = 1024 // (16 * AUTHORS_GPUS)  # = 16
AUTHORS_EFFECTIVE_AUX_COEFF = AUTHORS_AUX_COEFF * AUTHORS_GRAD_ACCUM  # = 0.016 (RouterConfig.aux_weight)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and what is allowed."""


def _allowed(literal: Any) -> tuple[str, ...]:
    """The values of a Literal, or a tuple of names as it is (a registry's)."""
    return literal if isinstance(literal, tuple) else tuple(get_args(literal))


def _check_choice(owner: str, name: str, value: Any, literal: Any) -> None:
    allowed = _allowed(literal)
    if value not in allowed:
        raise ConfigError(f"{owner}.{name}={value!r} is not allowed; choose one of {list(allowed)}")


def _check_positive(owner: str, name: str, value: float, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        raise ConfigError(f"{owner}.{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


# --------------------------------------------------------------------------------------
# Model shape: one row of grids/scales.yaml
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleShape:
    """Architecture numbers of one named scale (SmolLM shapes at real size, CPU sizes below)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int  # 0 = take the vocabulary size from the tokenizer (CPU scales)
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        own = f"scale[{self.name}]"
        for name in ("hidden", "layers", "heads", "kv_heads", "mlp", "max_seq_len"):
            _check_positive(own, name, getattr(self, name))
        _check_positive(own, "vocab", self.vocab, allow_zero=True)
        if self.hidden % self.heads:
            raise ConfigError(f"{own}: hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ConfigError(f"{own}: heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        if (self.hidden // self.heads) % 2:
            raise ConfigError(f"{own}: head dim {self.hidden // self.heads} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def load_scales(path: Path = SCALES_FILE) -> dict[str, ScaleShape]:
    """Read every named scale from YAML (the one place model sizes live). Built once per
    process while the file is unchanged (every run's plan and FLOPs ask for it)."""
    path = Path(path)

    def build(raw: Any) -> dict[str, ScaleShape]:
        if not isinstance(raw, dict) or not isinstance(raw.get("scales"), dict):
            raise ConfigError(f"{path}: expected a mapping with key 'scales'")
        out = {}
        for name, row in raw["scales"].items():
            try:
                out[str(name)] = from_dict(ScaleShape, {"name": str(name), **row}, where=f"{path}:scales.{name}")
            except ConfigError as e:
                raise ConfigError(f"{where(path, key_line(path, ['scales', name]))}: {e}") from None
        return out

    try:
        return dict(load_derived(path, build))
    except YamlError as e:
        raise ConfigError(str(e)) from None


# --------------------------------------------------------------------------------------
# Router, KV and relaxation (MoR only)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouterConfig:
    """How a MoR model assigns recursion depths to tokens (App. G)."""

    type: RouterType = "expert_choice"
    func: RouterFunc = "sigmoid"  # f in g = alpha * f(w^T h)
    alpha: float = 0.1  # scale applied after the router function
    temperature: float = 1.0  # logits are divided by it before f
    arch: RouterArch = "linear"  # linear | 2-layer MLP (GELU) | MLP with 4x wider hidden layer
    gating: Gating = "weighted"  # weighted: see `combine`; additive: h + (f(h)-h) + g
    # expert-choice, weighted gating: what a selected token's state becomes (f = the recursion
    # block, its residual connections included; docs/authors.md).
    #   layer_output  h + g*f(h)      the authors' release and the paper's equation (default)
    #   layer_update  h + g*(f(h)-h)  ours before issue 56: g interpolates between h and f(h),
    #                 so a small g leaves the residual stream's scale alone (kept as an ablation)
    combine: Combine = "layer_output"
    # expert-choice
    capacity: tuple[float, ...] = ()  # fraction of tokens kept at each recursion; () = hierarchical
    # top-k size k of a recursion of capacity c over T tokens: floor int(c*T) as the authors'
    # release (default), or ceil (ours before issue 56: never below the capacity). Both >= 1.
    capacity_rounding: CapacityRounding = "floor"
    aux: ExpertChoiceAux = "aux_loss"  # causal decision at inference: BCE aux loss or aux router
    aux_coeff: float = AUTHORS_AUX_COEFF  # the BCE coefficient as configured (their `coeff`, the paper's tables)
    # The BCE enters the loss as aux_coeff x aux_accum_steps: the authors' trainer adds it per
    # micro-batch undivided by their gradient-accumulation count G (see AUTHORS_GRAD_ACCUM:
    # G = 16 assuming 4 GPUs), so 16 reproduces their effective weight (0.016 at coeff 0.001);
    # 1 gives the configured coefficient as written (every run before issue 56).
    aux_accum_steps: int = AUTHORS_GRAD_ACCUM
    capacity_warmup_steps: int = 0  # start with every token active, shrink linearly
    # token-choice
    balancing: Balancing = "loss"
    balance_coeff: float = 0.1
    bias_update_rate: float = 0.001  # loss-free balancing bias step u
    # both
    z_loss_coeff: float = 0.0

    def __post_init__(self) -> None:
        own = "model.router"
        _check_choice(own, "type", self.type, kind_names())
        _check_choice(own, "func", self.func, RouterFunc)
        _check_choice(own, "arch", self.arch, arch_names())
        _check_choice(own, "gating", self.gating, Gating)
        _check_choice(own, "aux", self.aux, ExpertChoiceAux)
        _check_choice(own, "combine", self.combine, Combine)
        _check_choice(own, "capacity_rounding", self.capacity_rounding, CapacityRounding)
        _check_choice(own, "balancing", self.balancing, Balancing)
        _check_positive(own, "alpha", self.alpha)
        _check_positive(own, "temperature", self.temperature)
        for name in ("aux_coeff", "balance_coeff", "bias_update_rate", "z_loss_coeff", "capacity_warmup_steps"):
            _check_positive(own, name, getattr(self, name), allow_zero=True)
        if isinstance(self.aux_accum_steps, bool) or not isinstance(self.aux_accum_steps, int) \
                or self.aux_accum_steps < 1:
            raise ConfigError(f"{own}.aux_accum_steps={self.aux_accum_steps!r} must be an integer >= 1")
        why = router_kind(self.type).config_error(self)
        if why:
            raise ConfigError(f"{own}.{why}")
        for c in self.capacity:
            if not 0 < c <= 1:
                raise ConfigError(f"{own}.capacity entries must lie in (0, 1], got {list(self.capacity)}")

    @property
    def aux_weight(self) -> float:
        """The weight the expert-choice BCE enters the loss with: aux_coeff x aux_accum_steps."""
        return self.aux_coeff * self.aux_accum_steps


@dataclass(frozen=True)
class ModelConfig:
    """One model of the family: a scale, a variant and (for recursion) how layers are tied."""

    scale: str
    variant: Variant = "vanilla"
    tying: Tying = "middle_cycle"
    num_recursions: int = 1
    reduced: bool = False  # vanilla with the unique-layer count of an Nr-recursion model
    router: RouterConfig = field(default_factory=RouterConfig)
    kv: KVStrategy = "recursion_wise"
    relaxation: Relaxation = "none"
    relaxation_rank: int = 0  # LoRA/DoRA rank or prefix length
    tied_init: TiedInit = "random"
    init_checkpoint: str = ""  # up-training: SmolLM-format safetensors folder
    # Depth the tying plan is built from, instead of the scale's `layers` (0 = the scale's).
    # Recursive / MoR pad it like the scale's (tying.effective_depth), so Cycle Nr=3 with
    # layers: 30 has 10 unique layers per block (Table 11); a vanilla with layers: 34 is
    # App. E's 34-layer baseline for MoR-4.
    layers: int = 0
    # How the initial weights are drawn (mor.model.init): "crn" per parameter from a
    # generator keyed by (train.seed, its canonical name), so the variants of one seed share
    # their initial weights wherever names and shapes agree; "global_rng" the one global
    # stream that every run before issue 20 drew from (set it to reproduce those runs).
    weight_init: WeightInit = "crn"
    # Std of the residual output projections (o_proj, down_proj): "normal" N(0, init_std) like
    # every other matrix, as HF's _init_weights gives the authors' models (default); "scaled"
    # GPT-2's init_std / sqrt(2 * effective layers), ours before issue 56 (it keeps the
    # residual stream's variance from growing with depth; kept as an ablation).
    residual_init: ResidualInit = "normal"
    # Attention weights across the recursions of a shared layer: "tied" (one q/k/v/o per
    # unique layer, the paper's parameter counts and the authors' later commit 82c97f) or
    # "untied" (each recursion of a shared layer its own q/k/v/o, MLP and norms still shared:
    # the expert-choice wrapper of the authors' release aef56f7). Which one produced the
    # paper's numbers the released code cannot tell (docs/authors.md).
    recursion_attention: RecursionAttention = "tied"
    # A checkpoint folder the authors' trainer saved (their save_pretrained layout), imported as
    # this run's final weights instead of training them (issue 62; mor.checkpoints.authors): the
    # run's train job is an import job, and the model fields above must be what the importer
    # maps the checkpoint to. A relative path is read from the workflow's working directory.
    import_checkpoint: str = ""
    # The sha256 of the folder's files (mor.checkpoint_identity), filled by the grid loader so
    # that the run id follows the checkpoint's bytes; a grid that writes it pins the checkpoint.
    import_sha256: str = ""

    def __post_init__(self) -> None:
        own = "model"
        self._check_import()
        _check_choice(own, "residual_init", self.residual_init, ResidualInit)
        _check_choice(own, "recursion_attention", self.recursion_attention, RecursionAttention)
        if self.recursion_attention == "untied" and self.variant == "vanilla":
            raise ConfigError("model.recursion_attention='untied' unties attention across recursions; "
                              "it needs variant recursive/mor")
        if self.recursion_attention == "untied" and self.tying not in ("cycle", "middle_cycle"):
            raise ConfigError(f"model.recursion_attention='untied' needs tying cycle/middle_cycle (the authors' "
                              f"release builds MoR with those only), got {self.tying!r}")
        if self.recursion_attention == "untied" and self.relaxation != "none":
            raise ConfigError("model.recursion_attention='untied' cannot be combined with model.relaxation "
                              f"{self.relaxation!r} (the relaxations wrap the tied attention)")
        _check_choice(own, "variant", self.variant, Variant)
        _check_choice(own, "tying", self.tying, Tying)
        _check_choice(own, "kv", self.kv, KVStrategy)
        _check_choice(own, "relaxation", self.relaxation, Relaxation)
        _check_choice(own, "tied_init", self.tied_init, TiedInit)
        _check_choice(own, "weight_init", self.weight_init, WeightInit)
        _check_positive(own, "layers", self.layers, allow_zero=True)
        if self.reduced and self.layers:
            raise ConfigError("model.layers cannot be combined with model.reduced (the reduced depth is derived "
                              "from the scale's layers); set model.layers to the depth you want instead")
        if self.variant == "vanilla":
            # vanilla KV sharing reads num_recursions as the size of a KV-sharing group
            if self.num_recursions != 1 and not self.reduced and self.kv == "recursion_wise":
                raise ConfigError("model.num_recursions > 1 needs variant recursive/mor (or reduced: true, "
                                  "or kv: shared, where it is the KV-sharing group size)")
            if self.kv != "recursion_wise" and self.reduced:
                raise ConfigError("model.kv sharing for vanilla uses num_recursions as the group size; "
                                  "it cannot be combined with reduced: true")
        elif not 2 <= self.num_recursions <= 8:
            raise ConfigError(f"model.num_recursions={self.num_recursions} must be in [2, 8] for {self.variant}")
        if self.kv == "shared_dagger" and self.variant != "mor":
            raise ConfigError("model.kv='shared_dagger' needs variant 'mor' (without routing every "
                              "position is active, so it equals recursion_wise)")
        if self.reduced and self.variant != "vanilla":
            raise ConfigError("model.reduced only applies to variant 'vanilla'")
        if self.reduced and self.num_recursions < 2:
            raise ConfigError("model.reduced needs num_recursions >= 2 (the Nr it is reduced for)")
        if self.router.capacity and len(self.router.capacity) != self.num_recursions:
            raise ConfigError(
                f"model.router.capacity has {len(self.router.capacity)} entries; "
                f"model.num_recursions={self.num_recursions} needs one per recursion"
            )
        self._check_relaxation_and_init()

    def _check_import(self) -> None:
        """model.import_checkpoint: structure only (the folder itself is checked where the grid is
        loaded, mor.checkpoint_identity, so a stored config reads without it)."""
        if self.import_sha256 and not self.import_checkpoint:
            raise ConfigError(f"model.import_sha256={self.import_sha256!r} pins a checkpoint, but "
                              "model.import_checkpoint is not set")
        if self.import_sha256 and (len(self.import_sha256) != 64
                                   or any(c not in "0123456789abcdef" for c in self.import_sha256)):
            raise ConfigError(f"model.import_sha256={self.import_sha256!r}: expected 64 lowercase hex digits")
        if not self.import_checkpoint:
            return
        if self.variant != "mor":
            raise ConfigError(f"model.import_checkpoint={self.import_checkpoint!r} imports the authors' MoR "
                              f"checkpoints only; model.variant is {self.variant!r}, set it to 'mor'")
        if self.init_checkpoint or self.relaxation != "none":
            raise ConfigError(f"model.import_checkpoint={self.import_checkpoint!r} cannot be combined with "
                              "model.init_checkpoint or model.relaxation (the import is the run's final weights)")

    def _check_relaxation_and_init(self) -> None:
        """Relaxations (mor.model.relax) and tied-layer init (mor.checkpoints.hf)."""
        _check_positive("model", "relaxation_rank", self.relaxation_rank, allow_zero=True)
        if self.relaxation != "none" and self.variant == "vanilla":
            raise ConfigError(f"model.relaxation={self.relaxation!r} relaxes tied layers; it needs variant recursive/mor")
        if self.relaxation in ("lora", "dora", "prefix") and self.relaxation_rank < 1:
            what = "prefix length" if self.relaxation == "prefix" else "rank"
            raise ConfigError(f"model.relaxation={self.relaxation!r} needs model.relaxation_rank > 0 (the {what})")
        if self.relaxation in ("none", "recursion_pe") and self.relaxation_rank:
            raise ConfigError(f"model.relaxation_rank={self.relaxation_rank} has no effect with "
                              f"model.relaxation={self.relaxation!r}; set it to 0")
        if self.tied_init != "random" and not self.init_checkpoint:
            raise ConfigError(f"model.tied_init={self.tied_init!r} needs model.init_checkpoint (a vanilla checkpoint)")
        if self.init_checkpoint and self.tied_init == "random":
            raise ConfigError("model.init_checkpoint is set but model.tied_init='random' ignores it; "
                              "choose one of ['stepwise', 'average', 'upcycle']")


# --------------------------------------------------------------------------------------
# Data, training, evaluation
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from: the embedded Django docs corpus (CPU) or FineWeb-Edu (cluster)."""

    source: Literal["django-docs", "fineweb-edu"] = "django-docs"
    tokenizer: str = "bpe-4096"  # 'bpe-<vocab>' trained locally, or a hub tokenizer name
    train_tokens_cap: int = 0  # fineweb-edu: tokens to stream into the local shard (0 = budget)
    val_tokens: int = 65536

    def __post_init__(self) -> None:
        if self.source not in ("django-docs", "fineweb-edu"):
            raise ConfigError(f"data.source={self.source!r}; choose one of ['django-docs', 'fineweb-edu']")
        if self.tokenizer.startswith("bpe-"):
            try:
                int(self.tokenizer[4:])
            except ValueError:
                raise ConfigError(f"data.tokenizer={self.tokenizer!r}: expected 'bpe-<vocab size>'") from None
        _check_positive("data", "val_tokens", self.val_tokens)

    @property
    def bpe_vocab(self) -> int:
        """Vocabulary of a locally trained BPE tokenizer, 0 for a hub tokenizer."""
        return int(self.tokenizer[4:]) if self.tokenizer.startswith("bpe-") else 0


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation recipe (PAPER.md 'Training'): AdamW, warmup-stable-decay, clipping."""

    tokens: int = 1_000_000  # total training tokens; steps = tokens / (global_batch * seq_len)
    seq_len: int = 128
    global_batch: int = 16  # sequences per optimizer step, whatever the device count
    # The default forward-pass size (execution.micro_batch 0, capped at the per-rank batch).
    # Under data_order "rank" it is also the sampler's draw size (a draw is keyed by (seed,
    # step, draw, rank)), so it decides WHICH sequences a step trains on; under "sequence" it
    # does not, and it is no part of the run id (ORDER_NEUTRAL_FIELDS). How many sequences go through one
    # forward pass is execution.micro_batch (ExecConfig): a memory setting that renames nothing.
    micro_batch: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.0
    warmup_frac: float = 0.05
    warmup_steps: int = 0  # > 0: the warmup in steps, not warmup_frac (the authors' 57 / 86; issue 55)
    decay_frac: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    seed: int = 0
    # isoFLOP budget (§ 5.1): when > 0 the run trains as many whole steps as spend this many
    # training FLOPs under mor.flops (each variant's own cost per token), and `tokens` is
    # replaced by that count when the grid is expanded (mor.budget.resolve_budget).
    budget_flops: float = 0.0
    checkpoint_every: int = 50  # steps between checkpoints
    log_every: int = 1
    # Which sequences a step trains on (mor.data.sampler): "sequence" keys sequence j of step
    # s by (seed, s, j), so any split into ranks x micro-batches trains on the same data and a
    # run resumes on another GPU count unchanged; "rank" the (seed, step, draw, rank) draws of
    # every run before issue 22, whose data depend on the rank count (set it to reproduce them).
    data_order: DataOrder = "sequence"
    # Passes over the pool a run under data_order "pass" may read (mor.data.sampler.check_pass):
    # 1 = one pass without replacement, and a run longer than the pool stops before its first
    # step; more states a repeat (each epoch its own seeded permutation, logged as data_epoch).
    # Not part of the run id: it permits, it never changes which windows a run reads.
    data_epochs: int = 1
    # isoFLOP budgets the authors' way (issue 55 item 4, mor.branching, docs/isoflop.md): a run
    # whose branch_run is set trains only its decay, from the checkpoint that run (the warmup-
    # stable run of the largest budget, same model and data) saved at branch_step, which must
    # be this run's decay start. Part of the run id (the branch IS the stable run plus its point).
    branch_run: str = ""
    branch_step: int = 0
    # Steps at which this run keeps a checkpoint for a branch (checkpoints/branch/step-*), never
    # rotated away. Not part of the run id: extra checkpoints change nothing that is trained.
    save_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        own = "train"
        _check_choice(own, "data_order", self.data_order, DataOrder)
        if isinstance(self.data_epochs, bool) or not isinstance(self.data_epochs, int) or self.data_epochs < 1:
            raise ConfigError(f"train.data_epochs={self.data_epochs!r} must be an integer >= 1")
        for name in ("tokens", "seq_len", "global_batch", "micro_batch", "lr", "checkpoint_every", "log_every"):
            _check_positive(own, name, getattr(self, name))
        _check_positive(own, "budget_flops", self.budget_flops, allow_zero=True)
        _check_positive(own, "warmup_steps", self.warmup_steps, allow_zero=True)
        if self.global_batch % self.micro_batch:
            raise ConfigError(
                f"train.global_batch={self.global_batch} is not a multiple of train.micro_batch={self.micro_batch}"
            )
        if not 0 <= self.warmup_frac + self.decay_frac <= 1:
            raise ConfigError("train.warmup_frac + train.decay_frac must lie in [0, 1]")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ConfigError(f"train.precision={self.precision!r}; choose one of ['auto', 'bf16', 'fp32']")
        if self.steps < 1:
            raise ConfigError(
                f"train.tokens={self.tokens} is less than one step of {self.global_batch}x{self.seq_len} tokens"
            )
        if bool(self.branch_run) != bool(self.branch_step):
            raise ConfigError(f"train.branch_run={self.branch_run!r} and train.branch_step={self.branch_step} "
                              "go together: set both (a decay branch) or neither")
        if self.branch_step and self.branch_step != self.decay_start:
            raise ConfigError(f"train.branch_step={self.branch_step} must be this run's decay start "
                              f"{self.decay_start} (steps {self.steps} - round({self.steps} x train.decay_frac "
                              f"{self.decay_frac})): a branch trains its decay and nothing else")
        if any(isinstance(s, bool) or not isinstance(s, int) or not 0 < s < self.steps for s in self.save_steps) \
                or list(self.save_steps) != sorted(set(self.save_steps)):
            raise ConfigError(f"train.save_steps={list(self.save_steps)} must be increasing integers in "
                              f"(0, {self.steps})")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def steps(self) -> int:
        return self.tokens // self.tokens_per_step

    @property
    def decay_start(self) -> int:
        """The first step of the linear decay (mor.train.schedule.wsd_lr): steps - round(steps x decay_frac)."""
        return self.steps - int(round(self.steps * self.decay_frac))


@dataclass(frozen=True)
class EvalConfig:
    """What the eval job measures after training."""

    nll_tokens: int = 65536  # validation tokens scored for NLL (capped by the split size)
    batch: int = 8
    lm_eval_tasks: tuple[str, ...] = ()  # lm-evaluation-harness task names (mor_* = our offline copies)
    lm_eval_limit: int = 0  # examples per task (0 = all)
    lm_eval_limits: dict[str, int] = field(default_factory=dict)  # per-task override of lm_eval_limit
    lm_eval_fewshot: int | None = None  # shots per task (None = the task's own default)

    def __post_init__(self) -> None:
        _check_positive("eval", "nll_tokens", self.nll_tokens)
        _check_positive("eval", "batch", self.batch)
        if self.lm_eval_limit < 0:
            raise ConfigError(f"eval.lm_eval_limit must be >= 0 (0 = all), got {self.lm_eval_limit}")
        extra = sorted(set(self.lm_eval_limits) - set(self.lm_eval_tasks))
        if extra:
            raise ConfigError(f"eval.lm_eval_limits names task(s) {extra} that are not in eval.lm_eval_tasks "
                              f"{list(self.lm_eval_tasks)}")
        for task, n in self.lm_eval_limits.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ConfigError(f"eval.lm_eval_limits.{task} must be an integer >= 0 (0 = all), got {n!r}")
        f = self.lm_eval_fewshot
        if f is not None and (isinstance(f, bool) or not isinstance(f, int) or f < 0):
            raise ConfigError(f"eval.lm_eval_fewshot must be null or an integer >= 0, got {f!r}")

    def lm_eval_limit_for(self, task: str) -> int:
        """Examples scored of ``task`` (0 = all)."""
        return self.lm_eval_limits.get(task, self.lm_eval_limit)


# --------------------------------------------------------------------------------------
# Execution: how a run computes, not what it trains
# --------------------------------------------------------------------------------------
Attention = Literal["auto", "sdpa", "flash", "flex"]
FusedOptimizer = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class ExecConfig:
    """Settings that change how fast and in how much memory a run trains, never its result
    (beyond float summation order). They come from the presets / site profile per scale and
    GPU (``slurm/presets.yaml``: ``scales.<scale>.train.execution``), are recorded in the run's
    ``config.json`` next to the config, and are no part of ``config_hash``: a site that needs a
    smaller micro-batch, checkpointing or flash-attn trains the same run under the same id.
    """

    # Sequences per forward/backward pass on one rank; the step's per-rank sequences are
    # accumulated over passes of this size. 0 = the draw size (train.micro_batch, capped at
    # the per-rank batch); "auto" = the largest divisor of the per-rank batch that the memory
    # model (mor.memory) fits into the GPU's memory. Must divide the per-rank batch.
    micro_batch: int | str = 0
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    compile: bool = False  # torch.compile each layer for training (mor.train.trainer.compile_layers)
    # auto: flash-attn when installed on a CUDA device, else SDPA; masked attention (KV sharing,
    # prefix) through FlexAttention on CUDA in training, else chunked SDPA (mor.model.flex).
    # sdpa: SDPA everywhere (masks chunked); flex: masks through FlexAttention wherever torch can
    attention: Attention = "auto"
    fused_optimizer: FusedOptimizer = "auto"  # fused AdamW kernel; auto: on CUDA only
    # Tokens per cross-entropy chunk: the head and the loss run on this many positions at a
    # time, so the fp32 logits of a whole micro-batch never exist at once. 0 = all at once.
    loss_chunk: int = 0

    def __post_init__(self) -> None:
        own = "execution"
        mb = self.micro_batch
        if not (mb == "auto" or (isinstance(mb, int) and not isinstance(mb, bool) and mb >= 0)):
            raise ConfigError(f"{own}.micro_batch={mb!r}: expected an integer >= 0 (0 = train.micro_batch) or 'auto'")
        for name in ("activation_checkpointing", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{own}.{name}={getattr(self, name)!r}: expected true/false")
        _check_choice(own, "attention", self.attention, Attention)
        _check_choice(own, "fused_optimizer", self.fused_optimizer, FusedOptimizer)
        _check_positive(own, "loss_chunk", self.loss_chunk, allow_zero=True)


def exec_config(raw: dict[str, Any] | None, where: str = "execution") -> ExecConfig:
    """Validate an ``execution`` mapping (a preset entry's, or a test's) into an ExecConfig."""
    data = dict(raw or {})
    mb = data.get("micro_batch")
    if isinstance(mb, str) and mb != "auto":  # YAML gives 1e1 as a string: numbers are coerced
        try:
            data["micro_batch"] = _coerce_scalar(int, mb, f"{where}.micro_batch")
        except ConfigError:
            raise ConfigError(f"{where}.micro_batch={mb!r}: expected an integer >= 0 (0 = train.micro_batch) "
                              "or 'auto'") from None
    return from_dict(ExecConfig, data, where=where)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one run. Only the training fields are its identity
    (``config_hash``, ``run_id``); see ``mor.identity``."""

    grid: str
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    paper_scale: str = ""  # the paper's scale this run stands for (135M, ...), for tables
    label: str = ""  # short human name, e.g. 'Middle-Cycle Nr=3'

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def training_dict(self) -> dict[str, Any]:
        """The fields that decide the trained weights (model, train, data), as hashed (mor.identity);
        a model the authors' floor depth rule changed (issue 55, ``mor.depth.depth_moved``) carries
        ``model.depth_rule: floor``, so its run id moves and the others' stay."""
        out = training_fields(self)
        m = self.model
        if depth_moved(m.variant, m.tying, model_shape(m).layers, m.num_recursions, m.reduced):
            out["model"] = {**out["model"], "depth_rule": "floor"}
        return out

    def eval_dict(self) -> dict[str, Any]:
        """The fields that decide what the eval job measures of those weights."""
        return eval_fields(self)

    # Cached: the config is frozen, and Snakemake's input functions and the plan ask a run for
    # its id many times per run (computing it is an asdict, a JSON dump and a sha256).
    @functools.cached_property
    def config_hash(self) -> str:
        """Hash of the training fields: the run's identity, also guarding resume."""
        return digest(self.training_dict())

    @functools.cached_property
    def eval_hash(self) -> str:
        """Hash of the eval fields: when it changes, only the eval job re-runs."""
        return digest(self.eval_dict())

    @functools.cached_property
    def run_id(self) -> str:
        m = self.model
        parts = [self.paper_scale or m.scale, m.variant]
        if m.reduced:
            parts.append(f"reduced{m.num_recursions}")
        if m.variant != "vanilla":
            parts += [m.tying.replace("_", ""), f"nr{m.num_recursions}"]
        if self.train.seed:  # seed 0 (every grid's default) keeps the ids runs had before seeds
            parts.append(f"s{self.train.seed}")
        if m.import_checkpoint:  # the authors' weights, imported (issue 62): never one of our trainings
            parts.append("imported")
        return "-".join(parts + [self.config_hash[:8]]).replace(".", "p")


# --------------------------------------------------------------------------------------
# Dict -> dataclass, strictly
# --------------------------------------------------------------------------------------
def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with their location."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {unknown}; allowed keys are {sorted(known)}")
    kwargs = {}
    hints = _resolved_hints(cls)
    for name, value in data.items():
        hint = hints[name]
        sub = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(hint):
            kwargs[name] = from_dict(hint, value, where=sub)
        elif get_origin(hint) is dict:
            if not isinstance(value, dict):
                raise ConfigError(f"{sub}: expected a mapping, got {value!r}")
            key_t, val_t = get_args(hint)
            kwargs[name] = {_coerce_scalar(key_t, k, f"{sub}.{k}"): _coerce_scalar(val_t, v, f"{sub}.{k}")
                            for k, v in value.items()}
        elif get_origin(hint) is tuple:
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{sub}: expected a list, got {value!r}")
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = _coerce_scalar(hint, value, sub)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if where else str(e)) from None


@functools.lru_cache(maxsize=None)
def _resolved_hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a config dataclass (cached: from_dict runs per run)."""
    import typing

    return typing.get_type_hints(cls)


def _coerce_scalar(hint: Any, value: Any, where: str) -> Any:
    """YAML gives 1e9 as str and 10 as int; coerce numbers, refuse mismatched kinds."""
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint in (int, float):
        try:
            num = float(value) if isinstance(value, str) else value
        except ValueError:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if isinstance(num, bool) or not isinstance(num, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if hint is int:
            if not float(num).is_integer():
                raise ConfigError(f"{where}: expected an integer, got {value!r}")
            return int(num)
        return float(num)
    if hint is str or get_origin(hint) is Literal:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def run_config_from_dict(data: dict[str, Any], where: str = "run") -> RunConfig:
    data = dict(data)
    for (section, name), value in RETIRED_FIELDS.items():  # e.g. a stored config's model.attention
        if isinstance(data.get(section), dict) and name in data[section]:
            if data[section][name] != value:
                raise ConfigError(f"{where}.{section}.{name}={data[section][name]!r}: this setting moved out of the "
                                  f"run identity to the presets' execution.{name} (ExecConfig); remove it here")
            data[section] = {k: v for k, v in data[section].items() if k != name}
    return from_dict(RunConfig, data, where=where)


def model_shape(model: ModelConfig, scales: dict[str, ScaleShape] | None = None) -> ScaleShape:
    """The shape a run builds: its scale, with ``model.layers`` in place of the scale's
    depth when set. Every path that sizes a model (build, FLOPs, plan) goes through it."""
    shape = (scales or load_scales())[model.scale]
    return dataclasses.replace(shape, layers=model.layers) if model.layers else shape
