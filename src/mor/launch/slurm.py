"""Slurm resource presets (YAML) -> submitit parameters, and submit-and-wait for one job.

A preset file says, per model scale and job kind (train / eval / throughput), what one
Slurm job asks for. Sites differ, so it is data a user edits (or copies and points at with
``--config presets=/path/to/mine.yaml``); nothing here knows about a particular cluster::

    defaults: {partition: gpu, account: null, ..., sbatch: {}}     # every entry starts here
    scales:
      135M:
        train: {nodes: 1, gpus_per_node: 2, cpus_per_task: 8, mem_gb: 128, time_min: 1440}
        eval:  {gpus_per_node: 1, time_min: 120}

The whole file is validated on load; an error names the file and the key
(``slurm/presets.yaml: scales.135M.train.gpus_per_node: expected an integer >= 0, got 'two'``).

Only this module and the launcher talk to Slurm, and only through submitit: the Snakemake
process never imports torch or Slurm tooling.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable


from mor.config import load_scales, read_yaml_mapping

REPO = Path(__file__).resolve().parents[3]
DEFAULT_PRESETS = REPO / "slurm" / "presets.yaml"
KINDS = ("train", "eval", "throughput")
PARALLEL = ("ddp", "fsdp")
# sacct states after which a job will not run again (anything else may still run or requeue)
_INCOMPLETE = {"READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED", "SUSPENDED",
               "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "CONFIGURING"}


class PresetError(ValueError):
    """A preset file is malformed or lacks an entry; the message names the file and the key."""


class LaunchError(RuntimeError):
    """A Slurm job failed; the message names the job, its state and its log files."""


@dataclass(frozen=True)
class Preset:
    """What one Slurm job of one (scale, kind) asks for.

    One process per GPU: ``tasks_per_node`` follows ``gpus_per_node`` on GPU nodes; on CPU
    nodes (``gpus_per_node: 0``) it is set explicitly (the test cluster runs 2 gloo ranks so).
    """

    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int = 0  # 0 = one per GPU (or 1 without GPUs)
    cpus_per_task: int = 1  # also the torch CPU threads of each rank
    mem_gb: float = 8  # per node
    time_min: int = 60  # Slurm time limit; a longer run is checkpointed and requeued
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    sbatch: dict = field(default_factory=dict)  # extra #SBATCH flags: {exclusive: true, mail-type: FAIL}
    signal_delay_s: int = 120  # Slurm sends SIGUSR2 this long before the time limit
    max_timeouts: int = 20  # requeues after a time-out before submitit gives up (preemptions don't count)
    parallel: str = "ddp"  # train with world > 1: ddp or fsdp (fully sharded; 1.7B)
    tflops_per_gpu: float = 100.0  # sustained model TFLOP/s per GPU (per task on CPU): plan estimates only

    @property
    def tasks(self) -> int:
        """Processes per node."""
        return self.tasks_per_node or max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def submitit_parameters(self, name: str) -> dict[str, Any]:
        """``AutoExecutor.update_parameters`` keyword arguments (unset site fields omitted)."""
        params: dict[str, Any] = {
            "name": name, "timeout_min": self.time_min, "nodes": self.nodes, "tasks_per_node": self.tasks,
            "cpus_per_task": self.cpus_per_task, "mem_gb": self.mem_gb, "slurm_signal_delay_s": self.signal_delay_s,
        }
        if self.gpus_per_node:  # --gpus-per-node=0 is rejected by clusters without GRES
            params["gpus_per_node"] = self.gpus_per_node
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(self, key):
                params[f"slurm_{key}"] = getattr(self, key)
        if self.sbatch:
            params["slurm_additional_parameters"] = dict(self.sbatch)
        return params


_FIELDS = {f.name: f for f in fields(Preset)}
_INT_MIN = {"nodes": 1, "gpus_per_node": 0, "tasks_per_node": 0, "cpus_per_task": 1, "time_min": 1,
            "signal_delay_s": 0, "max_timeouts": 0}
_POSITIVE = ("mem_gb", "tflops_per_gpu")
_STR_OR_NULL = ("partition", "account", "qos", "constraint")


def _check_value(where: str, key: str, value: Any) -> Any:
    """One field of an entry, coerced like the run configs (YAML gives 1e3 as a string)."""
    if key in _INT_MIN:
        if isinstance(value, bool) or not isinstance(value, int) or value < _INT_MIN[key]:
            raise PresetError(f"{where}.{key}: expected an integer >= {_INT_MIN[key]}, got {value!r}")
        return value
    if key in _POSITIVE:
        try:
            num = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
        except ValueError:
            num = None
        if num is None or not num > 0:
            raise PresetError(f"{where}.{key}: expected a number > 0, got {value!r}")
        return num
    if key in _STR_OR_NULL:
        if value is not None and not isinstance(value, str):
            raise PresetError(f"{where}.{key}: expected a string or null, got {value!r}")
        return value or None
    if key == "parallel":
        if value not in PARALLEL:
            raise PresetError(f"{where}.{key}: {value!r} is not allowed; choose one of {list(PARALLEL)}")
        return value
    if key == "sbatch":
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise PresetError(f"{where}.{key}: expected a mapping of sbatch flag -> value, got {value!r}")
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)) or v is False:
                raise PresetError(f"{where}.{key}.{k}: expected a string, number or true, got {v!r}")
        return dict(value)
    raise AssertionError(key)


def _check_entry(where: str, raw: Any) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise PresetError(f"{where}: expected a mapping of settings, got {raw!r}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise PresetError(f"{where}: unknown key(s) {unknown}; allowed keys are {sorted(_FIELDS)}")
    return {k: _check_value(where, k, v) for k, v in raw.items()}


def _build(where: str, kind: str, values: dict) -> Preset:
    p = Preset(**values)
    if p.gpus_per_node and p.tasks_per_node and p.tasks_per_node != p.gpus_per_node:
        raise PresetError(f"{where}.tasks_per_node: {p.tasks_per_node} != gpus_per_node={p.gpus_per_node}; "
                          "training runs one process per GPU (leave tasks_per_node unset)")
    if kind != "train" and p.world_size != 1:
        raise PresetError(f"{where}: a {kind} job runs one process; nodes={p.nodes} x tasks={p.tasks} must be 1 "
                          f"(and gpus_per_node <= 1)")
    if p.signal_delay_s >= p.time_min * 60:
        raise PresetError(f"{where}.signal_delay_s: {p.signal_delay_s}s is not shorter than time_min={p.time_min} min")
    return p


@dataclass(frozen=True)
class Presets:
    path: Path
    entries: dict[tuple[str, str], Preset]  # (scale, kind) -> preset

    def get(self, scale: str, kind: str) -> Preset:
        if (scale, kind) in self.entries:
            return self.entries[(scale, kind)]
        known = sorted({s for s, _ in self.entries})
        if any(s == scale for s, _ in self.entries):
            have = sorted(k for s, k in self.entries if s == scale)
            raise PresetError(f"{self.path}: key scales.{scale}.{kind} is missing; scale {scale} has {have}")
        raise PresetError(f"{self.path}: key scales.{scale} is missing (no preset for scale {scale!r}); "
                          f"the file has {known}")


def load_presets(path: str | Path = DEFAULT_PRESETS) -> Presets:
    """Parse and validate a preset file; every error names the file and the key."""
    path = Path(path)
    raw = read_yaml_mapping(path, PresetError, "preset file",
                            missing_hint=" (set --config presets=/path/to/presets.yaml)")
    unknown = sorted(set(raw) - {"defaults", "scales"})
    if unknown:
        raise PresetError(f"{path}: unknown top-level key(s) {unknown}; allowed keys are ['defaults', 'scales']")
    defaults = _check_entry(f"{path}: defaults", raw.get("defaults"))
    scales_raw = raw.get("scales")
    if not isinstance(scales_raw, dict) or not scales_raw:
        raise PresetError(f"{path}: key scales: expected a mapping of scale -> {{train: ..., eval: ...}}")
    known_scales = load_scales()
    entries: dict[tuple[str, str], Preset] = {}
    for scale, kinds in scales_raw.items():
        scale = str(scale)
        where = f"{path}: scales.{scale}"
        if scale not in known_scales:
            raise PresetError(f"{where}: unknown scale {scale!r}; grids/scales.yaml has {sorted(known_scales)}")
        if not isinstance(kinds, dict):
            raise PresetError(f"{where}: expected a mapping of job kind -> settings, got {kinds!r}")
        bad = sorted(set(kinds) - set(KINDS))
        if bad:
            raise PresetError(f"{where}: unknown job kind(s) {bad}; allowed kinds are {list(KINDS)}")
        for kind, entry in kinds.items():
            values = {**defaults, **_check_entry(f"{where}.{kind}", entry)}
            entries[(scale, kind)] = _build(f"{where}.{kind}", kind, values)
    return Presets(path, entries)


# --------------------------------------------------------------------------------------
# Submit and wait
# --------------------------------------------------------------------------------------
def _job_record(folder: Path) -> Path:
    return folder / "job.json"


def _sacct_state(job_id: str) -> str:
    """Last sacct state of a job ('' if sacct does not know it)."""
    import subprocess

    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out[-1].split()[0] if out and out[-1].strip() else ""  # "CANCELLED by 0" -> "CANCELLED"


def _reattach(folder: Path, tasks: int):
    """The job a previous launcher submitted for this folder, if it can still run (else None).

    A launcher killed without a chance to cancel (login node reboot, SIGKILL) leaves its job
    running; re-running the workflow waits for that job instead of starting a second one
    that would write the same run directory.
    """
    import submitit

    record = _job_record(folder)
    if not record.exists():
        return None
    try:
        job_id = str(json.loads(record.read_text())["job_id"])
    except (json.JSONDecodeError, KeyError, OSError):
        return None
    state = _sacct_state(job_id).rstrip("+").upper()
    if state not in _INCOMPLETE or state == "UNKNOWN":
        return None
    return submitit.SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(tasks)))


def _failure_message(job, what: str, error: BaseException) -> str:
    """One line saying what went wrong, then the log paths, then the tail of the traceback."""
    from submitit.core.utils import FailedJobError

    paths = job._sub_jobs[0].paths if getattr(job, "_sub_jobs", None) else job.paths
    lines = [ln for ln in str(error).strip().splitlines()]
    if isinstance(error, FailedJobError):  # the callable raised: submitit quotes the traceback between dashes
        dashes = [i for i, ln in enumerate(lines) if ln.startswith("-----")]
        trace = lines[dashes[0] + 1:dashes[-1]] if len(dashes) >= 2 else lines
        cause = next((ln for ln in reversed(trace) if ln.strip()), "an exception")
    else:  # killed, cancelled, out of memory or out of requeues: no result pickle
        trace = lines
        state = ""
        try:
            state = job.get_info(mode="force").get("State", "")
        except Exception:  # noqa: BLE001 - the message must be written whatever sacct does
            pass
        cause = f"no result (Slurm state {state or 'unknown'}): {lines[0] if lines else ''}"
    tail = "\n".join("    " + ln for ln in trace[-25:])
    return (f"Slurm job {job.job_id} ({what}) failed: {cause.strip()}\n"
            f"  Slurm log: {paths.stderr}\n  stdout:    {paths.stdout}\n  folder:    {paths.folder}\n"
            f"  end of the job's error output:\n{tail}")


def submit_and_wait(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
                    python: str | None = None, setup: list[str] | None = None, poll_s: float = 2.0,
                    on_submit: Callable[[str], None] | None = None) -> list:
    """Run ``fn()`` as one Slurm job through submitit and block until it ends.

    Returns every task's return value (one per rank). Raises ``LaunchError`` naming the job,
    its final state and its log files if it fails, is cancelled, or runs out of requeues.
    SIGINT / SIGTERM to this process cancel the job (a user stopping the workflow), so no
    job outlives the workflow that asked for it, except after a hard kill; then the next
    launcher for the same folder re-attaches to it (``folder/job.json``).
    """
    import submitit
    from submitit.core.utils import FailedJobError, UncompletedJobError

    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    job = _reattach(folder, preset.world_size)
    if job is None:
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=preset.max_timeouts,
                                         slurm_python=python)
        executor.update_parameters(**preset.submitit_parameters(name), slurm_setup=list(setup or []))
        job = executor.submit(fn)
        _job_record(folder).write_text(json.dumps({"job_id": job.job_id, "name": name, "submitted": time.time()}))
        print(f"submitted Slurm job {job.job_id} ({what}); logs in {folder}", flush=True)
    else:
        print(f"re-attached to Slurm job {job.job_id} ({what}), still running; logs in {folder}", flush=True)
    if on_submit:
        on_submit(job.job_id)

    def cancel(signum, _frame):
        print(f"launcher got signal {signum}: cancelling Slurm job {job.job_id}", flush=True)
        job.cancel(check=False)
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, cancel) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not job.done():
            time.sleep(poll_s)
        try:
            return job.results()
        except (FailedJobError, UncompletedJobError) as e:
            raise LaunchError(_failure_message(job, what, e)) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def pythonpath_setup() -> list[str]:
    """sbatch lines that make ``mor`` importable in the job exactly as it is here."""
    src = Path(__file__).resolve().parents[2]
    return [f'export PYTHONPATH="{src}${{PYTHONPATH:+:$PYTHONPATH}}"']


def env_poll_s(default: float = 2.0) -> float:
    return float(os.environ.get("MOR_LAUNCH_POLL_S", default))
