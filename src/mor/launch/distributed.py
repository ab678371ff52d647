"""torch.distributed for a Slurm job: where a process sits (from submitit), and the process group.

Slurm starts one task per GPU (``srun`` inside submitit's sbatch script; ``tasks_per_node``
on CPU nodes), every task runs the same pickled callable, and ``submitit.JobEnvironment()``
tells each one its global rank, the number of tasks and its rank on the node. From that:

* world size 1: nothing is initialised; the plain ``Trainer`` runs (CPU or one GPU);
* otherwise the process group is initialised over TCP at the first node of the job
  (nccl on GPUs, gloo on CPU); the train job then wraps the model in DDP, or shards it
  with FSDP2 (``mor.train.parallel``; the 1.7B preset uses FSDP).

Model code stays single-device (STYLE.md): the process group lives here, the wrapped
trainers in ``mor.train.parallel``.
"""

from __future__ import annotations

import datetime
import os

import torch

from mor.train.trainer import DistInfo

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


def shutdown(barrier: bool = False) -> None:
    """Tear the process group down. ``barrier``: every rank finished its work (the success path),
    so wait for the others first: a rank that destroys gloo's group while a peer still uses it can
    abort ("terminate called without an active exception", seen on 2 gloo ranks in CI). Never on
    an error path, where a peer may sit in a collective that never completes."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if barrier and torch.distributed.get_world_size() > 1:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
