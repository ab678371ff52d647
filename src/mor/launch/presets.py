"""Slurm resource presets (YAML): loading, validation and lookups, torch- and submitit-free.

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

Apart from submission (``mor.launch.slurm_submit``) because the Snakemake process, the plan and
``mor status`` read presets too, and none of them may pull in submitit or torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mor.config import ConfigError, ExecConfig, exec_config, load_scales
from mor.yaml_io import read_yaml_mapping

REPO = Path(__file__).resolve().parents[3]
DEFAULT_PRESETS = REPO / "slurm" / "presets.yaml"
SITES_DIR = REPO / "slurm" / "sites"
SITE_ENV = "MOR_SITE"  # a site profile name (slurm/sites/<name>.yaml) or path; wins over the file's `site:`
KINDS = ("train", "eval", "lmeval", "throughput")  # per scale (lmeval: mor.lm_eval.job)
DATA_KIND = "data"  # the FineWeb-Edu preparation: one entry, top-level key `data`, CPUs only
PARALLEL = ("ddp", "fsdp")


class PresetError(ValueError):
    """A preset file is malformed or lacks an entry; the message names the file and the key."""


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
    start_s: float = 0.0  # a job's fixed seconds before and beside its FLOPs (process start, imports, loading a
                          # checkpoint): plan estimates only; what a small CPU job mostly costs
    peak_tflops_per_gpu: float = 0.0  # the GPU's peak dense bf16 TFLOP/s: MFU in the train log (0 = unknown)
    tokens_per_s_per_cpu: float = 350_000.0  # data job: tokenizer throughput per core, plan estimates only
    gpu_memory_gib: float = 0.0  # memory of one GPU (the site's): sizes execution.micro_batch 'auto' (0 = unknown)
    execution: dict = field(default_factory=dict)  # ExecConfig keys for the train job (how it computes)
    live_curves: str = ""  # train: mirror the train log to tensorboard / wandb ($WANDB_MODE, default offline), comma-separated; "" = off

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
_NON_NEGATIVE = {"peak_tflops_per_gpu": 1e5, "gpu_memory_gib": 1e4, "start_s": 86_400}  # 0 = unknown / none
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
