"""The job kinds of the DAG, in one table: what each kind runs, with which resources, writing what.

Layer: jobs. Below it the domain packages each own their job function (paths and strings
in, files out; they know no cluster): ``mor.train.job``, ``mor.eval.job``,
``mor.lm_eval.job``, ``mor.analysis.job``, ``mor.engine.job``, ``mor.data.fineweb``. Above it
``mor.launch`` runs any kind inline or as a Slurm job (one generic submitit wrapper), and the
plan and the Snakemake rules read the same table. Adding a kind = one domain function + one
entry here.

This module imports no torch and no domain package: the table names functions as
``"module:function"``, resolved only when a job runs, so the launcher on a login node (and
Snakemake parsing the rules) stays light.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from mor.layout import LM_EVAL_PATTERN, MEASUREMENT_PATTERN, SIDECAR_PATTERN, SUMMARY_PATTERN, THROUGHPUT_PATTERN


def resolve(ref: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (imports the module)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class JobKind:
    """One kind of job.

    function  the domain job, called with keyword arguments that are paths, strings and numbers
    preset    the presets.yaml entry (per scale, or top-level ``data``) its Slurm resources come
              from; None: never submitted, it runs where the workflow runs (the login or
              transfer node, which reaches the hub)
    outputs   the files it writes, as Snakemake patterns (the rules' ``output:``)
    summary   formats the one line a finished job prints, from what ``function`` returned
    settings  (run config, mode, wildcards) -> dict: what decides its output besides its inputs
              (the rule's ``params:`` trigger: an edit re-runs this job alone); None = nothing
    ranks     "all": every task of the Slurm job runs it as one rank of torch.distributed;
              "one": a single process
    returns   the keys of its result a Slurm job sends back to the launcher (empty = all)
    planned   the plan estimates its GPU-hours (it has a cost model in ``mor.launch.cost.job_cost``)
    online    it may reach the Hugging Face hub; every other kind runs with the hub and
              ``datasets`` offline (``environment``), reading only the shared cache that the
              ``hub`` job filled, so a compute node without internet never waits on a download
    """

    name: str
    function: str
    preset: str | None
    outputs: tuple[str, ...]
    summary: str
    settings: str | None = None
    ranks: str = "one"
    returns: tuple[str, ...] = ()
    planned: bool = False
    online: bool = False

    def __post_init__(self):
        if self.ranks not in ("one", "all"):
            raise ValueError(f"job kind {self.name}: ranks={self.ranks!r}; choose 'one' or 'all'")

    def run(self, **kwargs) -> dict:
        """Call the domain function in this process, in the kind's environment (what the user
        set explicitly wins: ``HF_HUB_OFFLINE=0`` lets a job reach the hub)."""
        for key, value in self.environment().items():
            os.environ.setdefault(key, value)
        return resolve(self.function)(**kwargs)

    def result(self, r: Mapping[str, Any]) -> dict:
        """What a Slurm job of this kind sends back (``returns``), from the function's result."""
        return {k: r[k] for k in self.returns} if self.returns else dict(r)

    def summarise(self, r: Mapping[str, Any]) -> str:
        return resolve(self.summary)(r)

    def environment(self) -> dict[str, str]:
        """Variables a job of this kind runs with (the launchers set them unless the user did)."""
        return {} if self.online else {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

    def settings_of(self, run, mode: str, wildcards: Mapping[str, str] | None = None) -> dict:
        """The job's own settings for ``run`` (empty when the kind has none)."""
        return resolve(self.settings)(run, mode, dict(wildcards or {})) if self.settings else {}


KINDS: dict[str, JobKind] = {k.name: k for k in (
    JobKind("hub", "mor.lm_eval.hub_cache:fill_hub_cache", preset=None, outputs=("{out}",),
            summary="mor.lm_eval.hub_cache:summary", online=True),
    JobKind("data", "mor.data.fineweb:prepare_job", preset="data",
            outputs=("{out}/train/manifest.json", "{out}/val/manifest.json"),
            summary="mor.data.fineweb:summary", online=True),
    JobKind("train", "mor.train.job:train_job", preset="train",
            outputs=(SUMMARY_PATTERN,), summary="mor.train.job:summary", ranks="all", planned=True),
    # a run that imports the authors' checkpoint (model.import_checkpoint): its train rule runs this
    # instead, where the workflow runs (nothing is trained; mor.launch picks it, ``import_kind``)
    JobKind("import", "mor.authors.import_job:import_job", preset=None,
            outputs=(SUMMARY_PATTERN,), summary="mor.authors.import_job:summary"),
    JobKind("eval", "mor.eval.job:eval_job", preset="eval",
            outputs=(MEASUREMENT_PATTERN,), summary="mor.eval.job:summary",
            settings="mor.eval.settings:job_settings", returns=("run_id", "val_nll", "val_tokens"), planned=True),
    JobKind("lmeval", "mor.lm_eval.job:lmeval_job", preset="lmeval",
            outputs=(LM_EVAL_PATTERN,), summary="mor.lm_eval.job:summary",
            settings="mor.lm_eval.job:job_settings", returns=("run_id", "tasks", "seconds"), planned=True),
    JobKind("analysis", "mor.analysis.job:analysis_job", preset="eval",
            outputs=(SIDECAR_PATTERN,), summary="mor.analysis.job:summary",
            settings="mor.analysis.sidecar:job_settings", planned=True),
    JobKind("throughput", "mor.engine.job:throughput_job", preset="throughput",
            outputs=(THROUGHPUT_PATTERN,), summary="mor.engine.job:summary",
            settings="mor.throughput_protocol:job_settings", planned=True),
)}
# one job per run of a grid (``import`` stands in for ``train`` where a run imports its weights)
RUN_KINDS = tuple(k for k in KINDS if k not in ("hub", "data", "import"))


def import_kind(name: str, run) -> str:
    """The kind that runs the ``name`` job of ``run``: ``import`` for the train job of a run whose
    weights are the authors' checkpoint (``model.import_checkpoint``), else ``name``."""
    return "import" if name == "train" and run.model.import_checkpoint else name


def kind(name: str) -> JobKind:
    if name not in KINDS:
        raise KeyError(f"unknown job kind {name!r}; known: {sorted(KINDS)}")
    return KINDS[name]
