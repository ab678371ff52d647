"""torch.distributed for a Slurm job: where a process sits (from submitit), and DDP / FSDP trainers.

Slurm starts one task per GPU (``srun`` inside submitit's sbatch script; ``tasks_per_node``
on CPU nodes), every task runs the same pickled callable, and ``submitit.JobEnvironment()``
tells each one its global rank, the number of tasks and its rank on the node. From that:

* world size 1: nothing is initialised; the plain ``Trainer`` runs (CPU or one GPU);
* otherwise the process group is initialised over TCP at the first node of the job
  (nccl on GPUs, gloo on CPU), and the trainer wraps the model in DDP, or shards it with
  FSDP2 (``fully_shard``; the 1.7B preset) where one GPU cannot hold the optimizer state.

The global batch stays the run's: ``Trainer`` gives each rank ``global_batch / world``
sequences of each step (addressed by (step, micro, rank), so ranks never overlap) and
accumulates micro-batches; DDP/FSDP average gradients over ranks, so one optimizer step
sees the mean gradient of the configured global batch however many GPUs there are.
Model code stays single-device (STYLE.md): all parallelism lives here.
"""

from __future__ import annotations

import datetime
import hashlib
import os

import torch

from mor.dtensor import gather_full, shard_like
from mor.train.checkpoint import apply_checkpoint, load_latest, save_checkpoint
from mor.train.trainer import DistInfo, Trainer, make_optimizer

PORT_BASE, PORT_SPAN = 20000, 20000  # rendezvous port = PORT_BASE + job id % PORT_SPAN


def job_environment():
    """submitit's view of this task, or None outside a submitit job."""
    import submitit

    try:
        return submitit.JobEnvironment()
    except RuntimeError:  # "Could not figure out which environment the job is runnning in"
        return None


def dist_info(env=None) -> DistInfo:
    """Rank, world size and local rank of this process (single process outside a job)."""
    env = env if env is not None else job_environment()
    if env is None:
        return DistInfo()
    return DistInfo(rank=env.global_rank, world_size=env.num_tasks, local_rank=env.local_rank)


def rendezvous(env) -> tuple[str, int]:
    """(address, port) of rank 0's TCP store: the job's first node, a port fixed by the job id.

    A single-node job uses the loopback address, so it works whether or not node names
    resolve; the port is stable across requeues of the same job (same id).
    """
    addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if env.num_nodes == 1 else env.hostnames[0])
    job_id = "".join(ch for ch in str(env.raw_job_id) if ch.isdigit()) or "0"
    port = int(os.environ.get("MASTER_PORT") or PORT_BASE + int(job_id) % PORT_SPAN)
    return addr, port


def init_distributed(device: str = "auto", env=None, timeout_min: float = 30) -> DistInfo:
    """Initialise torch.distributed for this task when the job has more than one; returns DistInfo."""
    env = env if env is not None else job_environment()
    info = dist_info(env)
    if info.world_size == 1 or torch.distributed.is_initialized():
        return info
    cuda = torch.cuda.is_available() and device in ("auto", "cuda")
    if cuda:
        torch.cuda.set_device(info.local_rank)  # "cuda" below then means this task's GPU
    addr, port = rendezvous(env)
    if addr == "127.0.0.1":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo binds to the loopback interface too
    torch.distributed.init_process_group(
        backend="nccl" if cuda else "gloo", init_method=f"tcp://{addr}:{port}", rank=info.rank,
        world_size=info.world_size, timeout=datetime.timedelta(minutes=timeout_min))
    return info


def shutdown() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


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

    def save(self) -> None:
        params, states = self._gathered()
        if self.dist.is_main:
            save_checkpoint(self.ckpt_dir, _FullState(params), _FullState(params, states), self.state())
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
