"""Slurm resource presets (YAML) -> submitit parameters, and submit-and-wait for one job.

A preset file says, per model scale and job kind (train / eval / lmeval / throughput), what one
Slurm job asks for. Sites differ, so it is data a user edits (or copies and points at with
``--config presets=/path/to/mine.yaml``); nothing here knows about a particular cluster::

    defaults: {partition: gpu, account: null, ..., sbatch: {}}     # every entry starts here
    scales:
      135M:
        train: {nodes: 1, gpus_per_node: 2, cpus_per_task: 8, mem_gb: 128, time_min: 1440}
        eval:  {gpus_per_node: 1, time_min: 120}

The whole file is validated on load; an error names the file and the key
(``slurm/presets.yaml: scales.135M.train.gpus_per_node: expected an integer >= 0, got 'two'``).

Only this module and the launcher talk to Slurm: submitit submits and cancels, and the
job's state comes from ``sacct`` and ``squeue`` (see "Submit and wait" below for why not
submitit's watcher). The Snakemake process never imports torch or Slurm tooling.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable


from mor.atomic import write_json_atomic
from mor.config import ConfigError, ExecConfig, exec_config, load_scales, read_yaml_mapping

REPO = Path(__file__).resolve().parents[3]
DEFAULT_PRESETS = REPO / "slurm" / "presets.yaml"
SITES_DIR = REPO / "slurm" / "sites"
SITE_ENV = "MOR_SITE"  # a site profile name (slurm/sites/<name>.yaml) or path; wins over the file's `site:`
KINDS = ("train", "eval", "lmeval", "throughput")  # per scale (lmeval: mor.lm_eval.job)
DATA_KIND = "data"  # the FineWeb-Edu preparation: one entry, top-level key `data`, CPUs only
PARALLEL = ("ddp", "fsdp")
# sacct / squeue states after which a job may still run or requeue; any other state is final
_INCOMPLETE = {"READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED", "SUSPENDED",
               "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "CONFIGURING", "STOPPED", "SIGNALING", "STAGE_OUT",
               "RESV_DEL_HOLD"}


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
    peak_tflops_per_gpu: float = 0.0  # the GPU's peak dense bf16 TFLOP/s: MFU in the train log (0 = unknown)
    tokens_per_s_per_cpu: float = 350_000.0  # data job: tokenizer throughput per core, plan estimates only
    gpu_memory_gib: float = 0.0  # memory of one GPU (the site's): sizes execution.micro_batch 'auto' (0 = unknown)
    execution: dict = field(default_factory=dict)  # ExecConfig keys for the train job (how it computes)
    live_curves: str = ""  # train: mirror the train log to tensorboard / wandb (offline), comma-separated; "" = off

    @property
    def exec_config(self) -> ExecConfig:
        """The train job's execution settings (mor.config.ExecConfig); validated on load."""
        return exec_config(self.execution)

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
# every number has a range; the upper ends only catch a typo or a unit slip (GiB for MiB), no site is near them
_NON_NEGATIVE = {"peak_tflops_per_gpu": 1e5, "gpu_memory_gib": 1e4}  # 0 = unknown
_INT_RANGE = {"nodes": (1, 10_000), "gpus_per_node": (0, 64), "tasks_per_node": (0, 1024),
              "cpus_per_task": (1, 4096), "time_min": (1, 366 * 24 * 60), "signal_delay_s": (0, 86_400),
              "max_timeouts": (0, 10_000)}
_POSITIVE = {"mem_gb": 1e5, "tflops_per_gpu": 1e5, "tokens_per_s_per_cpu": 1e9}
_STR_OR_NULL = ("partition", "account", "qos", "constraint")


def finite_number(where: str, value: Any, low: float, high: float, low_open: bool = False,
                  error: type[Exception] = PresetError) -> float:
    """``value`` as a float in [low, high] (or (low, high]); NaN, inf, booleans, null and text that
    is not a number fail, naming ``where``. YAML reads ``1e3`` as a string, so numeric text counts."""
    num = None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            num = float(value)
        except ValueError:
            num = None
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    if num is None or not math.isfinite(num) or num < low or (low_open and num == low) or num > high:
        raise error(f"{where}: expected a finite number {bound} and <= {high:g}, got {value!r}")
    return num


def _check_value(where: str, key: str, value: Any) -> Any:
    """One field of an entry, coerced like the run configs (YAML gives 1e3 as a string)."""
    if key in _INT_RANGE:
        lo, hi = _INT_RANGE[key]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise PresetError(f"{where}.{key}: expected an integer >= {lo} and <= {hi}, got {value!r}")
        return value
    if key in _POSITIVE:
        return finite_number(f"{where}.{key}", value, 0.0, _POSITIVE[key], low_open=True)
    if key in _NON_NEGATIVE:
        return finite_number(f"{where}.{key} (0 = unknown)", value, 0.0, _NON_NEGATIVE[key])
    if key in _STR_OR_NULL:
        if value is not None and not isinstance(value, str):
            raise PresetError(f"{where}.{key}: expected a string or null, got {value!r}")
        return value or None
    if key == "live_curves":
        from mor.train.live_curves import parse_setting  # torch-free (its sinks import torch when they start)

        try:
            return ",".join(parse_setting(value if isinstance(value, str) else str(value), f"{where}.{key}"))
        except ValueError as e:
            raise PresetError(str(e)) from None
    if key == "parallel":
        if value not in PARALLEL:
            raise PresetError(f"{where}.{key}: {value!r} is not allowed; choose one of {list(PARALLEL)}")
        return value
    if key == "execution":
        try:
            exec_config(value or {}, where=f"{where}.{key}")
        except ConfigError as e:
            raise PresetError(str(e)) from None
        return dict(value or {})
    if key == "sbatch":
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise PresetError(f"{where}.{key}: expected a mapping of sbatch flag -> value, got {value!r}")
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)) or v is False:
                raise PresetError(f"{where}.{key}.{k}: expected a string, number or true, got {v!r}")
            if isinstance(v, float) and not math.isfinite(v):
                raise PresetError(f"{where}.{key}.{k}: expected a finite number, got {v!r}")
        return dict(value)
    raise AssertionError(key)


def _check_entry(where: str, raw: Any, optional: bool = False) -> dict:
    """An entry's settings. ``{}`` means "the defaults"; a bare key (null) is refused unless the
    entry is ``optional`` (``defaults``): a value left out by mistake should not run on defaults."""
    if raw is None and optional:
        return {}
    if raw is None:
        raise PresetError(f"{where}: is empty (null); give its settings, or {{}} for the defaults")
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
    if kind == DATA_KIND and (p.gpus_per_node or p.world_size != 1):
        raise PresetError(f"{where}: the data job is one CPU process with worker processes on its cpus_per_task; "
                          f"it needs gpus_per_node 0 and nodes = tasks_per_node = 1, got gpus_per_node="
                          f"{p.gpus_per_node}, nodes={p.nodes}, tasks={p.tasks}")
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
    data_entry: Preset | None = None  # the top-level `data:` entry
    site: Site | None = None  # the site profile the GPU entries started from

    @property
    def data(self) -> Preset:
        """The data job's preset; a clear error if the file has none."""
        if self.data_entry is None:
            raise PresetError(f"{self.path}: key data is missing: the FineWeb-Edu preparation needs a CPU entry, e.g. "
                              "data: {gpus_per_node: 0, cpus_per_task: 32, mem_gb: 64, time_min: 1440}")
        return self.data_entry

    def get(self, scale: str, kind: str) -> Preset:
        if (scale, kind) in self.entries:
            return self.entries[(scale, kind)]
        known = sorted({s for s, _ in self.entries})
        if any(s == scale for s, _ in self.entries):
            have = sorted(k for s, k in self.entries if s == scale)
            raise PresetError(f"{self.path}: key scales.{scale}.{kind} is missing; scale {scale} has {have}")
        raise PresetError(f"{self.path}: key scales.{scale} is missing (no preset for scale {scale!r}); "
                          f"the file has {known}")


# --------------------------------------------------------------------------------------
# Site profiles: what a site's GPUs are (slurm/sites/<name>.yaml)
# --------------------------------------------------------------------------------------
SITE_KEYS = {"gpu", "gpu_memory_gib", "gpus_per_node", "peak_tflops_per_gpu", "tflops_per_gpu", "throughput_source"}


@dataclass(frozen=True)
class Site:
    """One GPU type as a site has it: selecting it sets the MFU peak, the plan's throughput
    (per job kind; 'assumed until measured' until benchmarks/device_check.py has run on it),
    the GPU memory the micro-batch is fitted to, and the node size the presets must fit in."""

    name: str
    gpu: str
    gpu_memory_gib: float
    gpus_per_node: int
    peak_tflops_per_gpu: float
    tflops_per_gpu: dict  # job kind -> sustained model TFLOP/s per GPU, for the plan's hours
    throughput_source: str  # "assumed until measured", or where the figure was measured

    @property
    def measured(self) -> bool:
        return self.throughput_source != "assumed until measured"


def site_path(name: str | Path) -> Path:
    """``h100-80gb`` -> slurm/sites/h100-80gb.yaml; a path is taken as it is."""
    p = Path(name)
    return p if p.suffix in (".yaml", ".yml") else SITES_DIR / f"{name}.yaml"


def known_sites() -> list[str]:
    return sorted(p.stem for p in SITES_DIR.glob("*.yaml"))


def load_site(name: str | Path) -> Site:
    """Parse and validate a site profile; errors name the file and the key."""
    path = site_path(name)
    raw = read_yaml_mapping(path, PresetError, "site profile", missing_hint=f" (known sites: {known_sites()})")
    where = f"{path}"
    unknown = sorted(set(raw) - SITE_KEYS)
    missing = sorted(SITE_KEYS - set(raw))
    if unknown or missing:
        raise PresetError(f"{where}: unknown key(s) {unknown} / missing key(s) {missing}; a site has {sorted(SITE_KEYS)}")
    for key in ("gpu", "throughput_source"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise PresetError(f"{where}: {key}: expected a non-empty string, got {raw[key]!r}")
    finite_number(f"{where}: gpu_memory_gib", raw["gpu_memory_gib"], 0.0, _NON_NEGATIVE["gpu_memory_gib"], low_open=True)
    finite_number(f"{where}: peak_tflops_per_gpu", raw["peak_tflops_per_gpu"], 0.0, _NON_NEGATIVE["peak_tflops_per_gpu"],
                  low_open=True)
    if isinstance(raw["gpus_per_node"], bool) or not isinstance(raw["gpus_per_node"], int) or \
            not 1 <= raw["gpus_per_node"] <= _INT_RANGE["gpus_per_node"][1]:
        raise PresetError(f"{where}: gpus_per_node: expected an integer >= 1 and <= {_INT_RANGE['gpus_per_node'][1]}, "
                          f"got {raw['gpus_per_node']!r}")
    tput = raw["tflops_per_gpu"]
    if not isinstance(tput, dict) or not tput or set(tput) - set(KINDS):
        raise PresetError(f"{where}: tflops_per_gpu: expected a non-empty mapping job kind ({list(KINDS)}) -> TFLOP/s "
                          f"(a kind left out keeps the entry's own figure), got {tput!r}")
    for kind, v in tput.items():
        finite_number(f"{where}: tflops_per_gpu.{kind}", v, 0.0, float(raw["peak_tflops_per_gpu"]), low_open=True)
    return Site(path.stem, str(raw["gpu"]), float(raw["gpu_memory_gib"]), raw["gpus_per_node"],
                float(raw["peak_tflops_per_gpu"]), {k: float(v) for k, v in tput.items()}, str(raw["throughput_source"]))


def _site_values(site: Site | None, kind: str) -> dict:
    """What a site sets in every entry of a GPU job kind (before the file's defaults and entry)."""
    if site is None:
        return {}
    out = {"peak_tflops_per_gpu": site.peak_tflops_per_gpu, "gpu_memory_gib": site.gpu_memory_gib}
    if kind in site.tflops_per_gpu:
        out["tflops_per_gpu"] = site.tflops_per_gpu[kind]
    return out


def load_presets(path: str | Path = DEFAULT_PRESETS, site: str | Path | None = None) -> Presets:
    """Parse and validate a preset file; every error names the file and the key.

    The site profile is ``site`` if given, else ``$MOR_SITE``, else the file's ``site:`` key
    (none: the entries' own numbers). Each GPU entry starts from the site's values, then
    the file's ``defaults``, then the entry itself: what the file sets explicitly wins."""
    path = Path(path)
    raw = read_yaml_mapping(path, PresetError, "preset file",
                            missing_hint=" (set --config presets=/path/to/presets.yaml)")
    unknown = sorted(set(raw) - {"defaults", "scales", DATA_KIND, "site"})
    if unknown:
        raise PresetError(f"{path}: unknown top-level key(s) {unknown}; allowed keys are "
                          "['data', 'defaults', 'scales', 'site']")
    chosen = site or os.environ.get(SITE_ENV) or raw.get("site")
    site_profile = load_site(chosen) if chosen else None
    defaults = _check_entry(f"{path}: defaults", raw.get("defaults"), optional=True)
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
        if not isinstance(kinds, dict) or not kinds:
            raise PresetError(f"{where}: expected a non-empty mapping of job kind -> settings, got {kinds!r}")
        bad = sorted(set(kinds) - set(KINDS))
        if bad:
            raise PresetError(f"{where}: unknown job kind(s) {bad}; allowed kinds are {list(KINDS)}")
        for kind, entry in kinds.items():
            values = {**defaults, **_check_entry(f"{where}.{kind}", entry)}
            if values.get("gpus_per_node"):
                values = {**_site_values(site_profile, kind), **values}
            p = entries[(scale, kind)] = _build(f"{where}.{kind}", kind, values)
            if site_profile and p.gpus_per_node > site_profile.gpus_per_node:
                raise PresetError(f"{where}.{kind}.gpus_per_node: {p.gpus_per_node} > the {site_profile.gpu} nodes' "
                                  f"{site_profile.gpus_per_node} (site {site_profile.name})")
    data = None
    if DATA_KIND in raw:
        data = _build(f"{path}: {DATA_KIND}", DATA_KIND, {**defaults, **_check_entry(f"{path}: {DATA_KIND}", raw[DATA_KIND])})
    return Presets(path, entries, data, site_profile)


# --------------------------------------------------------------------------------------
# Submit and wait
# --------------------------------------------------------------------------------------
# The launcher asks Slurm itself (not submitit's watcher, which backs off to one sacct call
# every 10 min and calls a job it cannot find UNKNOWN, i.e. "not done", forever): sacct
# first, squeue when sacct fails (slurmdbd down) or does not know the job (not recorded
# yet, or lost), and a bounded grace period for a job that neither knows.
UNKNOWN_S = 300.0  # MOR_LAUNCH_UNKNOWN_S: a job neither sacct nor squeue knows this long has vanished
STATE_POLL_S = 30.0  # MOR_LAUNCH_STATE_POLL_S: seconds between two questions to Slurm
RESULT_WAIT_S = 15.0  # MOR_LAUNCH_RESULT_WAIT_S: a result file may show up late on a shared file system
_CLI_TIMEOUT_S = 30  # one sacct / squeue call; a hung client counts as a failed one


@dataclass(frozen=True)
class Answer:
    """What one Slurm client said about a job: a state, ``""`` (no such job) or ``None`` (it failed)."""

    state: str | None
    note: str


@dataclass(frozen=True)
class SlurmState:
    """The launcher's view of a job: its Slurm state (``""`` if unknown) and where that came from.

    ``queue_answered`` is true when slurmctld itself answered (squeue ran): only then does
    "unknown" mean the job cannot still be pending or running.
    """

    state: str
    detail: str
    queue_answered: bool = False

    @property
    def known(self) -> bool:
        return bool(self.state) and self.state != "UNKNOWN"

    @property
    def finished(self) -> bool:
        """Slurm says the job will not run again (COMPLETED, FAILED, CANCELLED, NODE_FAIL, ...)."""
        return self.known and self.state not in _INCOMPLETE


def _client(cmd: list[str]) -> tuple[int, str, str] | None:
    """(returncode, stdout, stderr) of a Slurm client, or None if it is missing or hangs."""
    import subprocess

    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=_CLI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.returncode, p.stdout, p.stderr


def _first_state(stdout: str) -> str:
    """``CANCELLED by 0`` / ``RUNNING+`` -> ``CANCELLED`` / ``RUNNING``: the last listed record's state."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    return lines[-1].split()[0].rstrip("+").upper() if lines else ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def sacct_answer(job_id: str) -> Answer:
    """The job's state in the accounting database (slurmdbd); fails while slurmdbd is down."""
    out = _client(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
    if out is None:
        return Answer(None, "sacct did not run or timed out")
    rc, stdout, stderr = out
    if rc != 0:
        return Answer(None, f"sacct failed: {_last_line(stderr)}")
    state = _first_state(stdout)
    return Answer(state, f"sacct: {state}" if state else "sacct has no record of it")


def squeue_answer(job_id: str) -> Answer:
    """The job's state in slurmctld (``-t all``: ended jobs too, until MinJobAge forgets them)."""
    out = _client(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"])
    if out is None:
        return Answer(None, "squeue did not run or timed out")
    rc, stdout, stderr = out
    if rc != 0 and "invalid job id" not in stderr.lower():
        return Answer(None, f"squeue failed: {_last_line(stderr)}")
    state = _first_state(stdout) if rc == 0 else ""
    return Answer(state, f"squeue: {state}" if state else "squeue does not know it")


def slurm_state(job_id: str) -> SlurmState:
    """Ask sacct and squeue; the controller's live answer (squeue) wins whenever it has one.

    sacct alone is not enough: it may be down, may not have the job yet, may still say
    RUNNING for a job the controller no longer holds, and while a preempted job is being
    requeued its record can read FAILED although the job is PENDING again (seen on the test
    cluster). squeue alone is not enough either: it forgets an ended job after MinJobAge.
    So squeue's state is taken when slurmctld holds the job, else sacct's.
    """
    acct = sacct_answer(job_id)
    queue = squeue_answer(job_id)
    detail = f"{acct.note}; {queue.note}"
    if queue.state:
        return SlurmState(queue.state, detail, queue_answered=True)
    if queue.state == "" and acct.state in _INCOMPLETE:  # stale database: the controller has no such job
        return SlurmState("", detail, queue_answered=True)
    if acct.state:  # the controller forgot an ended job, or is unreachable: trust the database
        return SlurmState(acct.state, detail, queue_answered=queue.state == "")
    return SlurmState("", detail, queue_answered=queue.state == "")


def env_unknown_s(default: float = UNKNOWN_S) -> float:
    return float(os.environ.get("MOR_LAUNCH_UNKNOWN_S", default))


def env_state_poll_s(default: float = STATE_POLL_S) -> float:
    return float(os.environ.get("MOR_LAUNCH_STATE_POLL_S", default))


def env_result_wait_s(default: float = RESULT_WAIT_S) -> float:
    return float(os.environ.get("MOR_LAUNCH_RESULT_WAIT_S", default))


def _job_record(folder: Path) -> Path:
    return folder / "job.json"


def _recorded_job_id(folder: Path) -> str | None:
    """The job id a previous launcher wrote to ``folder/job.json`` (None if none or unreadable)."""
    try:
        return str(json.loads(_job_record(folder).read_text())["job_id"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, OSError):
        return None


def _reattach(folder: Path, tasks: int, what: str = "job"):
    """The job a previous launcher submitted for this folder, if it can still run (else None).

    A launcher killed without a chance to cancel (login node reboot, SIGKILL) leaves its job
    running; re-running the workflow waits for that job instead of starting a second one
    that would write the same run directory. When neither sacct nor squeue can say whether
    that job still runs, this raises ``LaunchError`` rather than risk a duplicate.
    """
    import submitit

    job_id = _recorded_job_id(folder)
    if job_id is None:
        return None
    st = slurm_state(job_id)
    if st.known and not st.finished:
        return submitit.SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(tasks)))
    if st.finished or st.queue_answered:  # ended, or slurmctld does not hold it: safe to submit anew
        return None
    record = _job_record(folder)
    raise LaunchError(
        f"cannot tell whether Slurm job {job_id} ({what}) from an earlier launch is still running "
        f"({st.detail}); not submitting a second job for the same run.\n"
        f"  Check `squeue -j {job_id}` and `sacct -j {job_id}` once Slurm answers: if the job is running, run "
        f"this again to wait for it (or `scancel {job_id}`); if it is gone, delete {record} and run this again.\n"
        f"  folder: {folder}")


def _tasks(job) -> list:
    """One submitit job per task (rank): the job itself when it has a single task."""
    return list(getattr(job, "_sub_jobs", None) or [job])


def _results_ready(job) -> bool:
    """Every task has written its result file (a value or a traceback)."""
    return all(t.paths.result_pickle.exists() for t in _tasks(job))


def _wait(job, what: str, poll_s: float, state_poll_s: float, unknown_s: float) -> SlurmState | None:
    """Block until every task left a result (returns None) or Slurm says the job ended (its state).

    Raises ``LaunchError`` once neither sacct nor squeue has known the job for ``unknown_s``
    seconds and no result came: a job cancelled and forgotten while slurmdbd was down, or
    lost with its node, would otherwise be waited for forever.
    """
    unknown_since: float | None = None
    next_ask = time.monotonic()
    while True:
        if _results_ready(job):
            return None
        now = time.monotonic()
        if now >= next_ask:
            st = slurm_state(job.job_id)
            next_ask = now + state_poll_s
            if st.finished:
                return st
            if st.known:
                unknown_since = None
            else:
                unknown_since = now if unknown_since is None else unknown_since
                if now - unknown_since >= unknown_s and not _results_ready(job):
                    raise LaunchError(_vanished_message(job, what, st, now - unknown_since))
        time.sleep(min(poll_s, state_poll_s))


def _log_paths(task) -> str:
    p = task.paths
    return f"  Slurm log: {p.stderr}\n  stdout:    {p.stdout}\n  folder:    {p.folder}\n"


def _vanished_message(job, what: str, st: SlurmState, unknown_for: float) -> str:
    return (f"Slurm job {job.job_id} ({what}) vanished: neither sacct nor squeue has known it for "
            f"{unknown_for:.0f}s ({st.detail}) and it left no result "
            f"(the limit is MOR_LAUNCH_UNKNOWN_S={env_unknown_s():g}s).\n{_log_paths(_tasks(job)[0])}"
            f"  Check `sacct -j {job.job_id}` / `squeue -j {job.job_id}`; running this again submits a new job, "
            f"which resumes from the run's last checkpoint.")


def _tail(path: Path, n: int = 25) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return [f"(no {path.name})"]


def _failure_message(task, job_id: str, what: str, cause: str, trace: list[str]) -> str:
    """One line saying what went wrong, then the log paths, then the tail of the traceback."""
    tail = "\n".join("    " + ln for ln in trace[-25:])
    return (f"Slurm job {job_id} ({what}) failed: {cause.strip()}\n{_log_paths(task)}"
            f"  end of the job's error output:\n{tail}")


def _wait_for_file(path: Path, within_s: float) -> bool:
    """True once ``path`` exists; shared file systems may show a job's last file late."""
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(1.0, within_s))
    return True


def _raise_if_raised(task, job_id: str, what: str, outcome: tuple[str, Any]) -> None:
    """``LaunchError`` quoting the traceback if the task's callable raised (submitit's ("error", trace))."""
    kind, value = outcome
    if kind == "error":
        trace = str(value).strip().splitlines()
        cause = next((ln for ln in reversed(trace) if ln.strip()), "an exception")
        raise LaunchError(_failure_message(task, job_id, what, cause, trace))


def _collect(job, what: str, st: SlurmState | None, result_wait_s: float) -> list:
    """Every task's return value, or ``LaunchError`` naming the first task that raised or left nothing.

    A rank's traceback is the real cause when another rank was killed waiting for it, so
    tracebacks are looked for before missing results.
    """
    from submitit.core.utils import pickle_load

    tasks = _tasks(job)
    outcomes = {i: pickle_load(t.paths.result_pickle) for i, t in enumerate(tasks) if t.paths.result_pickle.exists()}
    for i, outcome in outcomes.items():
        _raise_if_raised(tasks[i], job.job_id, what, outcome)
    for i, task in enumerate(tasks):
        if i in outcomes:
            continue
        if not _wait_for_file(task.paths.result_pickle, result_wait_s):
            state = f"{st.state}; {st.detail}" if st else "unknown"
            cause = f"no result (Slurm state {state}): killed, cancelled, out of memory or out of requeues"
            raise LaunchError(_failure_message(task, job.job_id, what, cause, _tail(task.paths.stderr)))
        outcomes[i] = pickle_load(task.paths.result_pickle)
        _raise_if_raised(task, job.job_id, what, outcomes[i])
    return [outcomes[i][1] for i in range(len(tasks))]


def submit_and_wait(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
                    python: str | None = None, setup: list[str] | None = None, poll_s: float = 2.0,
                    on_submit: Callable[[str], None] | None = None, state_poll_s: float | None = None,
                    unknown_s: float | None = None, result_wait_s: float | None = None) -> list:
    """Run ``fn()`` as one Slurm job through submitit and block until it ends.

    Returns every task's return value (one per rank). Raises ``LaunchError`` naming the job,
    its final state and its log files if it fails, is cancelled, runs out of requeues, or
    vanishes (unknown to sacct and squeue for ``unknown_s``). Slurm is asked every
    ``state_poll_s``; a job Slurm says has ended gets ``result_wait_s`` for its result file
    to appear. Unset, these come from MOR_LAUNCH_UNKNOWN_S / _STATE_POLL_S / _RESULT_WAIT_S.
    SIGINT / SIGTERM to this process cancel the job (a user stopping the workflow), so no
    job outlives the workflow that asked for it, except after a hard kill; then the next
    launcher for the same folder re-attaches to it (``folder/job.json``).
    """
    import submitit

    state_poll_s = env_state_poll_s() if state_poll_s is None else state_poll_s
    unknown_s = env_unknown_s() if unknown_s is None else unknown_s
    result_wait_s = env_result_wait_s() if result_wait_s is None else result_wait_s
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    job = _reattach(folder, preset.world_size, what)
    if job is None:
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=preset.max_timeouts,
                                         slurm_python=python)
        executor.update_parameters(**preset.submitit_parameters(name), slurm_setup=list(setup or []))
        try:
            job = executor.submit(fn)
        except submitit.core.utils.FailedJobError as e:  # sbatch exited non-zero: nothing was queued
            raise LaunchError(f"Slurm refused the submission of {what}: {str(e).strip() or 'sbatch failed'}\n"
                              f"  The preset asks for nodes={preset.nodes}, gpus_per_node={preset.gpus_per_node}, "
                              f"tasks_per_node={preset.tasks}, cpus_per_task={preset.cpus_per_task}, "
                              f"mem_gb={preset.mem_gb:g}, partition={preset.partition}; compare with "
                              f"`sinfo -N -o '%N %P %c %m %G'`. Nothing was submitted.\n  folder: {folder}") from None
        write_json_atomic(_job_record(folder), {"job_id": job.job_id, "name": name, "submitted": time.time()})
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
        st = _wait(job, what, poll_s, state_poll_s, unknown_s)
        return _collect(job, what, st, result_wait_s)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def pythonpath_setup() -> list[str]:
    """sbatch lines that make ``mor`` importable in the job exactly as it is here."""
    src = Path(__file__).resolve().parents[2]
    return [f'export PYTHONPATH="{src}${{PYTHONPATH:+:$PYTHONPATH}}"']


def env_poll_s(default: float = 2.0) -> float:
    return float(os.environ.get("MOR_LAUNCH_POLL_S", default))
