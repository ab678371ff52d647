"""The resumable training loop: one run config in, a trained model and per-step logs out.

State that makes a run resumable lives in the checkpoint (step, tokens seen, optimizer
moments, RNG); batches are addressed by step (see ``mor.data.sampler``), so a run resumed
at step s sees exactly the batches an uninterrupted run would have seen; under the default
``train.data_order: sequence`` that holds on any number of ranks and micro-batches.

Outputs under ``run_dir``::

    config.json          resolved run config + git commit + vocab size (written first)
    train_log.jsonl      one line per logged step (appended, flushed; trimmed on resume)
    checkpoints/         see mor.train.checkpoint
    final/model.safetensors, train_summary.json  (written last: the run's success marker)

Every file is written atomically (``mor.atomic``). A finished run (its summary and final
weights intact) re-entered for any reason returns its summary untouched; a run killed after
its last checkpoint but before its summary writes the same summary an undisturbed run would
(the last step's loss and the training time so far travel in the checkpoint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from mor.atomic import atomic_path, sha256_file, write_json_atomic
from mor.config import ExecConfig, RunConfig
from mor.flops import train_flops
from mor.layout import RunPaths
from mor.data.sampler import TokenSampler, check_pass, load_tokens
from mor.checkpoints.native import save_tensors
from mor.model.build import make_model, pick_device
from mor.model.transformer import MoRTransformer
from mor.provenance import git_commit
from mor.train.checkpoint import apply_checkpoint, load_branch_point, load_latest, save_checkpoint
from mor.train.execution import apply_execution
from mor.train.schedule import wsd_lr
from mor.train.stop import Preempted, StopRequest


@dataclass
class DistInfo:
    """Where this process sits in a (possibly single-process) job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def router_stats(model: MoRTransformer, trace) -> dict:
    """Router statistics of a step's last micro-batch for the train log (training curves):
    MaxVio of token-choice, sampling accuracy of expert-choice (causal decision vs top-k over
    each recursion's candidates, as the eval job counts it); App. G.2, mor.metrics.routing."""
    if trace is None or not trace.selected:
        return {}
    from mor.metrics import routing as rm

    if trace.assignment is not None:
        return {"max_vio": rm.max_vio(trace.assignment, model.cfg.num_recursions)}
    causal = torch.cat([c[m] for c, m in zip(trace.causal_keep, trace.candidates)])  # (candidates,)
    topk = torch.cat([s[m] for s, m in zip(trace.selected, trace.candidates)])  # (candidates,)
    return {"sampling_accuracy": rm.sampling_accuracy(causal, topk)}


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, sync: bool):
    """Skip the gradient all-reduce of DDP (``no_sync``) / FSDP2 on all but the last micro-batch.

    Gradients still accumulate locally; the reduction at the last micro-batch covers them all,
    so the result is the same with one collective per optimizer step instead of ``accum``.
    A plain module is untouched.
    """
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 (torch.distributed.fsdp.fully_shard)
        model.set_requires_gradient_sync(sync)
        yield
    elif hasattr(model, "no_sync") and not sync:  # DistributedDataParallel
        with model.no_sync():
            yield
    else:
        yield


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast where the device supports it; fp32 elsewhere (and on CPU by default)."""
    if precision == "fp32":
        return None
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if precision == "bf16":
        raise RuntimeError(f"train.precision='bf16' but device {device} does not support bf16")
    return None


def initial_model(run: RunConfig, vocab_size: int, device: torch.device) -> MoRTransformer:
    """The run's model as training starts it: the network from the model layer
    (``mor.model.build.make_model``, seeded by ``train.seed``); a checkpoint is read only when the
    run starts from one (``model.init_checkpoint``: up-training, per ``model.tied_init``), so a run
    trained from scratch never reaches the checkpoint formats."""
    model = make_model(run, vocab_size, device)
    if run.model.init_checkpoint:
        from mor.checkpoints.hf import init_from_checkpoint

        init_from_checkpoint(model, run.model.init_checkpoint, run.model.tied_init)
    return model


@dataclass(frozen=True)
class TrainerSeams:
    """The trainer's collaborators that a dry run replaces (``mor.rehearsal`` runs the train job
    on fake tensors, which have no values and no data-dependent shapes); the defaults are the
    real ones, so a training run never sets this. Passing them in, rather than patching this
    module, keeps the dependency visible: rename one and the rehearsal fails where it names it.

    router_stats    (model, routing trace) -> the step's logged router statistics
    check_pass      (sampler, steps, epochs, source) -> the epochs a ``data_order: pass`` run reads
    autocast_dtype  (precision, device) -> the autocast dtype, None = fp32
    backward        (loss) -> None: the backward pass of one micro-batch's scaled loss
    """

    router_stats: Callable = router_stats
    check_pass: Callable = check_pass
    autocast_dtype: Callable = autocast_dtype
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward


def compile_layers(model: MoRTransformer) -> None:
    """execution.compile: ``torch.compile`` each unique layer in place (regional compilation).

    Not the whole model: inductor (torch 2.13, CPU) silently miscompiles the backward of a
    whole MoR expert-choice model (3 recursions: gradients upstream of the third off by ~1 %,
    the loss right; aot_eager and inductor with max_fusion_size=1 are exact, so a kernel-fusion
    bug around routing's index_select / index_add). Per layer, the routing glue (top-k, row
    gathers, index_add) stays eager and the blocks that hold nearly all the FLOPs are compiled;
    a recursion reuses its layer's compiled code, compiling is faster (tiny MoR, 2 CPU cores:
    ~17 s instead of ~90 s), parameter names stay (checkpoints), and DDP / FSDP wrap the model
    as before (both checked on 2 gloo ranks against one eager process).
    """
    import torch._dynamo

    # LoRA / DoRA are forward hooks on a shared layer's projections, applied for the slot active
    # at that call (mor.model.relax): without guards on hooks, the code compiled for an
    # unrelaxed layer is reused for a relaxed one and the deltas silently skipped
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    # one compiled entry per (hooks, relaxation slot, shape) of the one layer class: more than 8
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    for layer in model.unique_layers:
        layer.compile()


def use_fused_adamw(setting: str, device: torch.device) -> bool:
    """execution.fused_optimizer: the fused AdamW kernel on CUDA ('auto', 'on'), never on CPU
    (the same update up to float rounding; one kernel per step instead of one per tensor)."""
    if setting == "on" and device.type != "cuda":
        raise ValueError(f"execution.fused_optimizer='on' needs a CUDA device, got {device}")
    return setting != "off" and device.type == "cuda"


def make_optimizer(model: torch.nn.Module, run: RunConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norms and gains are not decayed)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    t = run.train
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.lr,
        betas=(t.beta1, t.beta2),
        fused=fused,
    )


def resolve_micro_batch(execution: ExecConfig, run: RunConfig, per_rank: int, draw: int, vocab: int,
                        world: int, parallel: str, device: torch.device) -> int:
    """The sequences of one forward pass: execution.micro_batch, the draw size (0), or the
    memory model's largest fit into this GPU's memory ('auto'; the draw size on CPU)."""
    mb = execution.micro_batch
    if mb == "auto":
        if device.type != "cuda":
            return draw
        from mor.memory import pick_micro_batch

        gpu_bytes = torch.cuda.get_device_properties(device).total_memory
        return pick_micro_batch(run, vocab, gpu_bytes, world=world, parallel=parallel, execution=execution).micro_batch
    mb = mb or draw
    if per_rank % mb:
        raise ValueError(f"execution.micro_batch={mb} does not divide the per-rank batch {per_rank} "
                         f"(train.global_batch={run.train.global_batch} over {world} rank(s))")
    return mb


class Trainer:
    # set by the train job (mor.train.job): a signal asks the loop to checkpoint and stop at the
    # end of the step in progress (mor.train.stop); None = no preemption handling
    stop: StopRequest | None = None
    # set by the train job: live curves (mor.train.live_curves) fed each logged row; None = off
    curves = None

    def __init__(
        self,
        run: RunConfig,
        run_dir: Path,
        train_tokens: Path,
        vocab_size: int,
        device: str = "auto",
        dist: DistInfo | None = None,
        progress: bool = True,
        threads: int = 0,
        peak_tflops: float = 0.0,
        execution: ExecConfig | None = None,
        parallel: str = "ddp",
        seams: TrainerSeams | None = None,
    ):
        """``execution`` (ExecConfig, from the presets): how the run computes, never what it
        trains; ``parallel`` only sizes the 'auto' micro-batch (the wrapper is the subclass's);
        ``seams``: the real collaborators unless a dry run passes its own (``TrainerSeams``)."""
        self.run, self.run_dir = run, Path(run_dir)
        self.seams = seams or TrainerSeams()
        self.files = RunPaths.of(self.run_dir)  # the run folder's layout (mor.layout)
        self.dist = dist or DistInfo()
        self.device = pick_device(device)
        self.execution = execution or ExecConfig()
        t = run.train
        if threads and self.device.type == "cpu":  # a resource, not part of the run's identity
            torch.set_num_threads(threads)
        torch.manual_seed(t.seed)
        self.model = initial_model(run, vocab_size, self.device)  # model.init_checkpoint read only when named
        self.vocab_size = self.model.vocab_size
        # model FLOPs of one optimizer step (mor.flops, the same count as the isoFLOP budget)
        # and the devices' peak FLOP/s for MFU (presets' peak_tflops_per_gpu; 0 = unknown: null)
        self.step_flops = train_flops(run.model, self.model.shape, self.vocab_size, t.seq_len, t.tokens_per_step)
        self.peak_flops = peak_tflops * 1e12 * self.dist.world_size
        apply_execution(self.model, self.execution.attention, self.execution.activation_checkpointing,
                        self.execution.loss_chunk)
        self.optimizer = make_optimizer(self.model, run, use_fused_adamw(self.execution.fused_optimizer, self.device))
        # shard digests are checked by one rank per job (hashing 40 GB of FineWeb-Edu once per
        # job start costs ~1 min; per rank it would be that times the rank count); sizes by all
        self.sampler = TokenSampler(load_tokens(train_tokens, checksum=self.dist.is_main), t.seq_len, t.seed,
                                    global_batch=t.global_batch, order=t.data_order)
        # data_order "pass": the run must fit the epochs it states (1: one pass without
        # replacement), checked before any step is trained; None under the random orders
        self.data_epochs = (self.seams.check_pass(self.sampler, t.steps, t.data_epochs, str(train_tokens))
                            if t.data_order == "pass" else None)
        per_rank = t.global_batch // self.dist.world_size
        if t.global_batch % self.dist.world_size:
            raise ValueError(f"train.global_batch={t.global_batch} is not divisible by {self.dist.world_size} ranks")
        # The step's sequences are the run's (train.data_order; under the legacy "rank" order,
        # drawn in draws of train.micro_batch) and run through the model in passes of
        # execution.micro_batch (the memory: execution; 0 = this draw size).
        self.draw = min(t.micro_batch, per_rank)
        if per_rank % self.draw:
            raise ValueError(f"per-rank batch {per_rank} is not a multiple of train.micro_batch={self.draw}")
        self.micro = resolve_micro_batch(self.execution, run, per_rank, self.draw, self.vocab_size,
                                         self.dist.world_size, parallel, self.device)
        self.accum = per_rank // self.micro  # gradient accumulation keeps the global batch fixed
        self.compiled = False  # execution.compile: the layers are compiled in place at the first step
        self.amp = self.seams.autocast_dtype(t.precision, self.device)
        self.step, self.tokens_seen = 0, 0
        self.train_time_s = 0.0  # summed over every session of this run, up to the last checkpoint
        self.last_metrics: dict = {}  # the last step's logged metrics (for the summary after a resume)
        self.ckpt_dir = self.files.checkpoints
        self.progress = progress and self.dist.is_main
        self.ddp_model = None  # set by mor.train.parallel when world_size > 1

    # ------------------------------------------------------------------ state
    def resume(self) -> bool:
        """Restore the newest intact checkpoint if there is one; True if resumed."""
        found = load_latest(self.ckpt_dir, self.run.config_hash)
        if found is None:
            return False
        path, state, tensors, moments = found
        apply_checkpoint(self.model, self.optimizer, path, state, tensors, moments)
        self.restore_counters(state)
        return True

    def restore_counters(self, state: dict) -> None:
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        saved = state.get("data_position")
        if saved is not None and self.data_epochs is not None and saved != self.sampler.pass_position(self.step):
            raise ValueError(f"run {self.run.run_id}: its checkpoint at step {self.step} stopped at {saved} of the "
                             f"pass, but the pool read now puts that step at {self.sampler.pass_position(self.step)}: "
                             "the token pool changed under the run; restore it or train the run afresh")
        self.train_time_s = float(state.get("train_time_s", 0.0))
        self.last_metrics = dict(state.get("last_metrics", {}))

    def state(self) -> dict:
        out = {"step": self.step, "tokens_seen": self.tokens_seen, "config_hash": self.run.config_hash,
               "train_time_s": self.train_time_s, "last_metrics": self.last_metrics}
        if self.data_epochs is not None:  # data_order "pass": where the next step reads (a check on resume)
            out["data_position"] = self.sampler.pass_position(self.step)
        return out

    # how a full tensor becomes what a parameter holds when a checkpoint is applied (FSDP: its shard)
    _place = None

    def save(self, ckpt_dir: Path | None = None, keep: int = 2) -> None:
        if self.dist.is_main:
            save_checkpoint(ckpt_dir or self.ckpt_dir, self.model, self.optimizer, self.state(), keep=keep)

    @property
    def branch_dir(self) -> Path:
        """Where the checkpoints kept for decay branches go (train.save_steps; never rotated)."""
        return self.ckpt_dir / "branch"

    def branch_source(self) -> Path:
        """The checkpoint this decay branch starts from: its stable run's (a sibling run folder)
        kept at train.branch_step (mor.branching)."""
        t = self.run.train
        return RunPaths.of(self.run_dir.parent / t.branch_run).checkpoints / "branch" / f"step-{t.branch_step:06d}"

    def start_branch(self) -> None:
        """Start a decay branch from its stable run's checkpoint at the branch step: weights,
        AdamW moments and step counts, RNG, step and tokens seen; the steps after it are this run's."""
        t = self.run.train
        path = self.branch_source()
        state, tensors, moments = load_branch_point(path, t.branch_run, t.branch_step)
        apply_checkpoint(self.model, self.optimizer, path, state, tensors, moments, place=self._place)
        self.restore_counters(state)

    def full_params(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters by name, on CPU, on the main rank ({} elsewhere).

        mor.train.parallel overrides it (and ``save``/``resume``) for FSDP, where
        gathering the shards is a collective every rank must join.
        """
        if not self.dist.is_main:
            return {}
        return {n: p.detach().contiguous().cpu() for n, p in self.model.named_parameters()}

    def _trim_log(self, step: int) -> None:
        """Keep the log lines up to ``step`` (0: none) so a resumed run never duplicates rows.

        A job killed mid-write leaves a torn last line; it is dropped with the steps after the
        checkpoint, which the resumed run logs again.
        """
        log = self.files.train_log
        if not log.exists():
            return
        keep = []
        for ln in log.read_text().splitlines():
            try:
                row = json.loads(ln)
            except json.JSONDecodeError:
                continue  # torn by a kill: the step is re-run and re-logged
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                keep.append(ln)
        with atomic_path(log) as tmp:
            tmp.write_text("".join(k + "\n" for k in keep))

    def finished_summary(self) -> dict | None:
        """The summary of a run that already finished, else None.

        Finished means: ``final/summary.json`` and the final weights it records (sha256) are
        intact. Snakemake deletes a job's output (``train_summary.json``) before re-running
        it; the marker is then restored from ``final/summary.json`` byte for byte, mtime too.
        """
        marker, kept = self.files.summary, self.files.final_summary
        final = self.files.weights
        try:
            summary = json.loads(kept.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if summary.get("config_hash") != self.run.config_hash or summary.get("steps") != self.run.train.steps:
            return None
        if not final.exists() or sha256_file(final) != summary.get("final_sha256"):
            return None
        if self.dist.is_main and (not marker.exists() or marker.read_bytes() != kept.read_bytes()):
            with atomic_path(marker) as tmp:
                shutil.copy2(kept, tmp)
        return summary

    # ------------------------------------------------------------------ loop
    def train_step(self) -> dict:
        """One optimizer step over ``accum`` micro-batches; returns its logged metrics."""
        t = self.run.train
        model = self.ddp_model or self.model
        model.train()
        lr = wsd_lr(self.step, t.steps, t.lr, t.warmup_frac, t.decay_frac, t.min_lr_ratio, t.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        warm = self.run.model.router.capacity_warmup_steps
        self.model.capacity_scale = min(1.0, self.step / warm) if warm else 1.0
        if self.execution.compile and not self.compiled:  # after DDP / FSDP wrapped the model
            compile_layers(self.model)
            self.compiled = True
        lm_total, aux_total = 0.0, 0.0
        for micro, (x, y) in enumerate(self.micro_batches()):
            x, y = x.to(self.device), y.to(self.device)
            with grad_sync(model, micro == self.accum - 1):  # DDP/FSDP reduce gradients once per step
                with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                    out = model(x, y)
                self.seams.backward(out.loss / self.accum)
            lm_total += out.lm_loss.item() / self.accum
            aux_total += float(out.aux_loss.detach()) / self.accum
        if self.dist.world_size > 1 and torch.distributed.is_initialized():  # log the global-batch mean
            totals = torch.tensor([lm_total, aux_total], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(totals)
            lm_total, aux_total = (totals / self.dist.world_size).tolist()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
        for name, value in (("loss", lm_total), ("auxiliary loss", aux_total), ("gradient norm", float(grad_norm))):
            if not math.isfinite(value):  # before the update: the saved weights stay finite
                raise FloatingPointError(f"run {self.run.run_id}: {name} is {value} at step {self.step + 1}; "
                                         f"nothing of this step was saved (last checkpoint: {self.ckpt_dir})")
        self.optimizer.step()
        self.model.after_optimizer_step()  # e.g. the loss-free balancing bias of token-choice
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += t.tokens_per_step
        row = {"step": self.step, "loss": lm_total, "aux_loss": aux_total, "lr": lr, "grad_norm": float(grad_norm),
               **self.seams.router_stats(self.model, out.routing)}
        if self.data_epochs is not None:  # data_order "pass": the pass (1, 2, ..) this step's last window is from
            row["data_epoch"] = self.sampler.epochs_needed(self.step)
        return row

    def micro_batches(self):
        """This rank's sequences of the current step, ``accum`` pairs (x, y) of (micro, T) each.

        The sampler gives the rank's slice of the step (data_order "sequence": the contiguous
        global sequences rank * per_rank ..; "rank": the legacy draws of ``draw``), which is
        cut in order into passes of ``micro`` (what decides the memory, never the data).
        ``micro`` divides the per-rank batch, so the cut gives ``accum`` passes; a dry run that
        lowers ``accum`` (``mor.rehearsal``) gets the step's first ``accum`` of them."""
        x, y = self.sampler.rank_batch(self.step, self.dist.rank, self.dist.world_size, self.draw)  # (per_rank, T)
        yield from itertools.islice(zip(x.split(self.micro), y.split(self.micro)), self.accum)  # accum x (micro, T)

    def fit(self) -> dict:
        """Train to ``train.steps``, checkpointing periodically; returns the summary."""
        t = self.run.train
        done = self.finished_summary()
        if done is not None:  # re-entered after it finished: nothing to redo, nothing rewritten
            return done
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            write_json_atomic(self.files.config, {
                "run_id": self.run.run_id, "config_hash": self.run.config_hash, "git_commit": git_commit(),
                "vocab_size": self.vocab_size, "n_params": self.model.num_params(), "config": self.run.to_dict(),
                # how it computed (not its identity): the resolved micro-batch and the rest
                "execution": {**dataclasses.asdict(self.execution), "micro_batch": self.micro,
                              "accumulation": self.accum, "world_size": self.dist.world_size},
            })
        resumed_from = self.step if self.resume() else None
        if resumed_from is None and t.branch_run:  # a decay branch's first session: from its stable run
            self.start_branch()
        if self.dist.is_main:  # one writer: ranks replacing the same file concurrently would race
            self._trim_log(self.step)
        log = open(self.files.train_log, "a") if self.dist.is_main else None
        curves = self.curves if self.dist.is_main else None
        if curves is not None:
            curves.start(self.step)
        bar = tqdm(total=t.steps, initial=self.step, disable=not self.progress, desc=self.run.run_id,
                   unit="step", mininterval=2.0, dynamic_ncols=True)
        try:
            while self.step < t.steps:
                step_start = time.perf_counter()
                last = self.train_step()
                dt = time.perf_counter() - step_start
                self.train_time_s += dt
                last["tokens_per_s"] = t.tokens_per_step / dt
                last["model_flops_per_s"] = self.step_flops / dt
                last["mfu"] = self.step_flops / dt / self.peak_flops if self.peak_flops else None
                last["tokens_seen"] = self.tokens_seen
                self.last_metrics = last
                if log and (self.step % t.log_every == 0 or self.step == t.steps):
                    log.write(json.dumps(last) + "\n")
                    log.flush()
                    if curves is not None:
                        curves.write(last)
                bar.update(1)
                bar.set_postfix(loss=f"{last['loss']:.3f}", tok_s=f"{last['tokens_per_s']:.0f}")
                if self.step in t.save_steps:  # a decay branch starts here (mor.branching): kept for good
                    self.save(self.branch_dir, keep=len(t.save_steps))
                saved = self.step % t.checkpoint_every == 0 and self.step < t.steps
                if saved:
                    self.save()
                if self.stop is not None and self.step < t.steps and self.stop.requested(self.dist.world_size):
                    if not saved:
                        self.save()  # every rank joins: FSDP gathers the full tensors
                    raise Preempted(self.step, self.stop.signum, self.ckpt_dir)
        finally:
            bar.close()
            if log:
                log.close()
            if curves is not None:
                curves.close()
        if resumed_from != t.steps:  # a run resumed at its last step already has this checkpoint
            self.save()
        summary = {
            "run_id": self.run.run_id,
            "config_hash": self.run.config_hash,
            "steps": self.step,
            "tokens_seen": self.tokens_seen,
            "final_loss": self.last_metrics.get("loss", float("nan")),
            "train_time_s": self.train_time_s,
            "tokens_per_s": self.tokens_seen / self.train_time_s if self.train_time_s > 0 else float("nan"),
            "resumed_from": resumed_from,
            "train_flops": self.step_flops * self.step,
            "mfu": (self.step_flops * self.step / self.train_time_s / self.peak_flops
                    if self.peak_flops and self.train_time_s > 0 else None),
            "n_params": self.model.num_params(),
            "device": str(self.device),
            "world_size": self.dist.world_size,
        }
        if self.data_epochs is not None:  # data_order "pass": passes over the pool read (1 = without replacement)
            summary["data_epochs"] = self.data_epochs
        if t.branch_run:  # a decay branch: the steps before branch_step are its stable run's
            summary["branched_from"] = {"run": t.branch_run, "step": t.branch_step}
        params = self.full_params()  # a collective under FSDP: every rank takes part
        if self.dist.is_main:
            final = self.files.final
            final.mkdir(exist_ok=True)
            with atomic_path(self.files.weights) as tmp:
                summary["final_sha256"] = save_tensors(params, tmp)["sha256"]
            write_json_atomic(self.files.final_summary, summary)
            with atomic_path(self.files.summary) as tmp:  # last: the success marker
                shutil.copy2(self.files.final_summary, tmp)
        return summary
