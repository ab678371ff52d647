"""A job's Slurm preset as Snakemake resources: what each rule's ``resources:`` declares.

Why: the launcher (``python -m mor.launch <kind> --launcher slurm``) submits a job with the
preset of its run's scale and kind (``mor.launch.presets.Presets.get``); before this module
Snakemake saw only ``job_kind=train``, so neither its dry run nor its scheduler knew what a
job would ask of the cluster. The rules now declare the same preset's numbers, taken from
the same ``Presets`` object and the same ``(scale, kind)`` key as the launcher and
``mor.launch plan`` (``mor.jobs.KINDS[kind].preset``), so

* ``snakemake --profile slurm -n`` prints, for every job, its GPUs, memory and time limit;
* ``--resources gpu=16`` caps the GPUs in flight (Snakemake counts each job's ``gpu``);
* the names are the ones Snakemake's own Slurm executor plugin reads (``slurm_partition``,
  ``slurm_account``, ``runtime`` in minutes, ``cpus_per_task``, ``nodes``, ``tasks``, ``gpu``,
  ``qos``, ``constraint``), but memory: ``node_mem_mib``, the preset's ``mem_gb`` per node in
  MiB (what Slurm's ``--mem`` gets). Snakemake prints a ``mem_mb`` as three numbers in two
  conventions (``mem_mb=131072, mem=131.07 GB, mem_mib=125000``: it takes the MiB as decimal
  MB); under its own name the memory is shown once, in one unit.
* ``runtime`` is the job's own time limit (``mor.launch.cost.time_limit_min``: its estimate
  times the kind's margin, at most the preset's ``time_min``), as the plan prints and the
  launcher submits (``run_resource``).

Pure and torch-free (Snakemake calls it while it builds the DAG, once per job and resource).
"""

from __future__ import annotations

from mor.config import RunConfig
from mor.launch.presets import Preset, PresetError, Presets

# Resource names, in the order the dry run prints them. Integers: Snakemake sums them for
# --resources; strings: passed through (only where the preset sets them).
INT_RESOURCES = ("nodes", "tasks", "gpu", "cpus_per_task", "node_mem_mib", "runtime")
STR_RESOURCES = ("slurm_partition", "slurm_account", "qos", "constraint")
NAMES = INT_RESOURCES + STR_RESOURCES


def preset_resources(preset: Preset) -> dict[str, int | str]:
    """One job's resources from its preset: the numbers ``submitit_parameters`` submits."""
    out: dict[str, int | str] = {
        "nodes": preset.nodes,
        "tasks": preset.world_size,  # processes of the whole job (one per GPU)
        "gpu": preset.gpus,  # GPUs of the whole job (nodes x gpus_per_node)
        "cpus_per_task": preset.cpus_per_task,
        "node_mem_mib": round(preset.mem_gb * 1024),  # per node, like Slurm's --mem (MiB; mem_gb is GiB)
        "runtime": preset.time_min,
    }
    for key, name in (("partition", "slurm_partition"), ("account", "slurm_account"), ("qos", "qos"),
                      ("constraint", "constraint")):
        if getattr(preset, key):
            out[name] = getattr(preset, key)
    return out


def job_preset(presets: Presets, scale: str, preset_key: str) -> Preset | None:
    """The preset the launcher would submit with (``presets.data`` for the data job), or
    None where the file has none for this kind at this scale: such a job gets no resources
    here, the launcher fails it when it runs, and ``mor.launch plan`` names it first
    (``NO PRESET``, or an error for a scale the file lacks altogether). Failing here instead
    would stop the dry run of every target for one grid's missing entry."""
    if preset_key == "data":
        return presets.data
    try:
        return presets.get(scale, preset_key)
    except PresetError:
        return None


def resource(presets: Presets, scale: str, preset_key: str, name: str) -> int | str | None:
    """One resource of one job: its preset's value; 0 (or None for a string resource the
    preset leaves unset) where there is nothing to ask for."""
    p = job_preset(presets, scale, preset_key)
    values = preset_resources(p) if p is not None else {}
    if name in INT_RESOURCES:
        return int(values.get(name, 0))
    return values.get(name)


_TIMED: dict[tuple, int] = {}  # (presets, run id, kind, analysis, mode) -> the job's time limit


def run_resource(presets: Presets, run: RunConfig, kind: str, name: str, analysis: str = "",
                 mode: str = "cluster") -> int | str | None:
    """One resource of one run's job of ``kind``: ``resource`` of its preset, but ``runtime``
    the job's own time limit (``mor.launch.cost.timed_preset``), as the launcher submits it."""
    from mor.jobs import KINDS
    from mor.launch.cost import PLANNED, timed_preset

    key = KINDS[kind].preset
    p = job_preset(presets, run.model.scale, key)
    if name != "runtime" or p is None or kind not in PLANNED:
        return resource(presets, run.model.scale, key, name)
    k = (id(presets), run.run_id, kind, analysis, mode)
    if k not in _TIMED:
        _TIMED[k] = timed_preset(run, kind, p, analysis, mode).time_min
    return _TIMED[k]


# What the plan models for a train job on a GPU preset (``mor.launch.cost.memory_fit``): the
# micro-batch the job will run and its peak memory per GPU. Shown, not requested: Slurm books
# whole GPUs, and Snakemake counts these only if ``--resources`` names them.
MEMORY_RESOURCES = ("planned_micro_batch", "planned_gpu_mem_mib")


def train_memory(presets: Presets, run: RunConfig) -> dict[str, int]:
    """``planned_micro_batch`` and ``planned_gpu_mem_mib`` of a run's train job: the plan's
    micro-batch and modelled GiB per GPU (its ``micro`` and ``GiB/GPU`` columns), 0 where it
    models nothing (a CPU preset, no site memory, no preset)."""
    from mor.launch.cost import memory_fit

    p = job_preset(presets, run.model.scale, "train")
    micro, gib, _fits = memory_fit(run, p) if p is not None else (0, 0.0, True)
    return {"planned_micro_batch": int(micro), "planned_gpu_mem_mib": round(gib * 1024)}
