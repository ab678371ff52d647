"""DDP and FSDP trainers: the training loop of ``mor.train.trainer`` on several ranks.

Which ranks exist, and how the process group comes up, is the launcher's business
(``mor.launch.distributed`` initialises torch.distributed from Slurm's task variables);
this module only wraps the model once the group exists, so the train job can pick a
trainer class without knowing the cluster.

The global batch stays the run's: ``Trainer`` gives each rank ``global_batch / world``
sequences of each step (a contiguous slice of the step's global sequence indices under
``train.data_order: sequence``, so ranks never overlap and together see what one process
sees; see ``mor.data.sampler``) and accumulates micro-batches; DDP/FSDP average gradients
over ranks, so one optimizer step sees the mean gradient of the configured global batch
however many GPUs there are.
"""

from __future__ import annotations

import hashlib

import torch

from mor.dtensor import gather_full, shard_like
from mor.train.checkpoint import apply_checkpoint, load_latest, save_checkpoint
from mor.train.trainer import Trainer, make_optimizer


def param_fingerprint(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: equal on all DDP ranks iff they hold the same model."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class DDPTrainer(Trainer):
    """Trainer whose forward/backward run through DistributedDataParallel.

    The bare model stays ``self.model`` (checkpoints, clipping and evaluation use it);
    ``self.ddp_model`` is what the training step calls. MoR routing can leave a module
    without gradient in a step, so DDP looks for unused parameters there.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index if self.device.index is not None else torch.cuda.current_device()] \
            if self.device.type == "cuda" else None
        self.ddp_model = DDP(self.model, device_ids=ids, find_unused_parameters=self.run.model.variant == "mor")

    def fit(self) -> dict:
        summary = super().fit()
        summary["param_fingerprint"] = param_fingerprint(self.model)  # returned, not written: ranks must agree
        return summary


class _FullState:
    """Duck-types ``named_parameters()`` (a module) and ``.state`` (an optimizer) over gathered
    CPU tensors, so FSDP checkpoints reuse ``save_checkpoint`` and its on-disk format."""

    def __init__(self, params: dict[str, torch.Tensor], states: dict[str, dict] | None = None):
        self._params = params
        self.state = {params[n]: s for n, s in (states or {}).items()}

    def named_parameters(self):
        return iter(self._params.items())


class FSDPTrainer(Trainer):
    """Trainer with the model sharded by FSDP2: each unique layer is one unit, the root
    (embeddings, norm, routers) another. A recursive model calls a unit several times per
    forward; FSDP re-gathers it each time and accumulates its gradient shards.

    Checkpoints keep the single-file format of ``mor.train.checkpoint``: saving gathers full
    tensors (every rank joins; rank 0 writes), resuming reads the full tensors on every rank
    and keeps this rank's shard. So a run may resume on a different number of GPUs.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

        for layer in self.model.unique_layers:
            fully_shard(layer)
            # KV sharing and the prefix relaxation call a layer's project_kv outside its forward:
            # FSDP must gather the layer's weights for that call too
            register_fsdp_forward_method(layer, "project_kv")
        fully_shard(self.model)
        self.optimizer = make_optimizer(self.model, self.run)  # over the sharded parameters
        self.ddp_model = self.model

    def _gathered(self) -> tuple[dict, dict]:
        params, states = {}, {}
        for n, p in self.model.named_parameters():  # same order on every rank
            full = gather_full(p.detach())
            s = self.optimizer.state.get(p)
            moments = {k: gather_full(s[k]) for k in ("exp_avg", "exp_avg_sq")} if s else {}
            if self.dist.is_main:
                params[n] = full.cpu()
                if s:
                    states[n] = {"step": s["step"], **{k: v.cpu() for k, v in moments.items()}}
        return params, states

    _place = staticmethod(shard_like)  # a decay branch's start keeps this rank's shard (Trainer.start_branch)

    def save(self, ckpt_dir=None, keep: int = 2) -> None:
        params, states = self._gathered()
        if self.dist.is_main:
            save_checkpoint(ckpt_dir or self.ckpt_dir, _FullState(params), _FullState(params, states), self.state(),
                            keep=keep)
        torch.distributed.barrier()

    def full_params(self) -> dict[str, torch.Tensor]:
        return self._gathered()[0]

    def resume(self) -> bool:
        """Every rank reads the full tensors of the newest intact checkpoint and keeps its shard."""
        found = load_latest(self.ckpt_dir, self.run.config_hash)
        if found is None:
            return False
        path, state, tensors, moments = found
        apply_checkpoint(self.model, self.optimizer, path, state, tensors, moments, place=shard_like)
        self.restore_counters(state)
        return True


def trainer_class(parallel: str) -> type[Trainer]:
    """The Trainer for a multi-process job: 'ddp' (replicated model) or 'fsdp' (sharded)."""
    if parallel == "ddp":
        return DDPTrainer
    if parallel == "fsdp":
        return FSDPTrainer
    raise ValueError(f"parallel={parallel!r}; choose one of ['ddp', 'fsdp']")
