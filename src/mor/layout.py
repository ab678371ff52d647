"""Where a run's files live: the one place that spells the run-folder layout.

Every job, reader, report and Snakemake rule finds a run's files through this module, so
changing the layout is an edit here, not a hunt (``tests/unit/test_layout.py`` fails when another
module spells a pattern again). Torch-free and pure: paths only, nothing is read or created.

    runs/<grid>/<run_id>/                      RunPaths(grid, run_id).dir
        config.json                            .config         resolved config + git commit
        train_log.jsonl                        .train_log      one JSON line per step
        checkpoints/step-<n>/                  .checkpoints
        final/model.safetensors                .final, .weights
        final/summary.json                     .final_summary  kept copy of the marker
        train_summary.json                     .summary        written last: the run trained
        lm_eval.json                           .lm_eval        the lmeval job's output
        throughput.json                        .throughput     the throughput job's output
        usage/<job>.json                       .usage(job)     what a local job cost (mor.usage)
    results/runs/<grid>/<run_id>.parquet       .row            the eval job's result row
    results/runs/<grid>/<run_id>.<a>.npz       .sidecar(a)     an analysis job's arrays
    results/<grid>.parquet                     grid_results(grid)
    logs/<grid>/<run_id>/<job>.log             run_log(logs, grid, run_id, job): a rule's log
    logs/slurm/<grid>/<run_id>/<kind>/         job_folder(logs/slurm, ...): submitit's folder,
        job.json                               .. with the Slurm job's record

The ``*_PATTERN`` strings are the same paths with Snakemake wildcards, for rule outputs and
the job table (``mor.jobs``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RUNS = "runs"
RESULTS = "results"
LOGS = "logs"
SLURM_LOGS = f"{LOGS}/slurm"
JOB_RECORD_FILE = "job.json"

CONFIG_FILE = "config.json"
TRAIN_LOG_FILE = "train_log.jsonl"
CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"
WEIGHTS_FILE = "model.safetensors"
FINAL_SUMMARY_FILE = "summary.json"  # final/summary.json: the kept copy of the success marker
SUMMARY_FILE = "train_summary.json"
LM_EVAL_FILE = "lm_eval.json"
THROUGHPUT_FILE = "throughput.json"
USAGE_DIR = "usage"  # usage/<job>.json: a local job's CPU and wall seconds (mor.usage)

RUN_PATTERN = f"{RUNS}/{{grid}}/{{run_id}}"
SUMMARY_PATTERN = f"{RUN_PATTERN}/{SUMMARY_FILE}"
LM_EVAL_PATTERN = f"{RUN_PATTERN}/{LM_EVAL_FILE}"
THROUGHPUT_PATTERN = f"{RUN_PATTERN}/{THROUGHPUT_FILE}"
ROW_PATTERN = f"{RESULTS}/{RUNS}/{{grid}}/{{run_id}}.parquet"
SIDECAR_PATTERN = f"{RESULTS}/{RUNS}/{{grid}}/{{run_id}}.{{analysis}}.npz"
GRID_RESULTS_PATTERN = f"{RESULTS}/{{grid}}.parquet"


def run_log_pattern(job: str) -> str:
    """``logs/{grid}/{run_id}/<job>.log``: the log of one job of a run, as a rule's ``log:``."""
    return f"{LOGS}/{{grid}}/{{run_id}}/{job}.log"


@dataclass(frozen=True)
class RunPaths:
    """The files of run ``run_id`` of grid ``grid`` under ``root`` (the repository root, or
    wherever ``runs/`` and ``results/`` live). ``RunPaths.of(run_dir)`` starts from a run
    folder that was passed in (``--run-dir runs/<grid>/<id>``), wherever it is."""

    grid: str
    run_id: str
    root: Path = Path(".")
    run_dir: Path | None = None  # set by ``of``: a run folder outside <root>/runs/

    @classmethod
    def of(cls, run_dir: str | Path, results_root: str | Path = ".") -> "RunPaths":
        d = Path(run_dir)
        return cls(grid=d.parent.name, run_id=d.name, root=Path(results_root), run_dir=d)

    @property
    def dir(self) -> Path:
        return self.run_dir if self.run_dir is not None else run_dir(self.root / RUNS, self.grid, self.run_id)

    @property
    def config(self) -> Path:
        return self.dir / CONFIG_FILE

    @property
    def train_log(self) -> Path:
        return self.dir / TRAIN_LOG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.dir / CHECKPOINTS_DIR

    @property
    def final(self) -> Path:
        return self.dir / FINAL_DIR

    @property
    def weights(self) -> Path:
        return self.final / WEIGHTS_FILE

    @property
    def final_summary(self) -> Path:
        return self.final / FINAL_SUMMARY_FILE

    @property
    def summary(self) -> Path:
        return self.dir / SUMMARY_FILE

    @property
    def lm_eval(self) -> Path:
        return self.dir / LM_EVAL_FILE

    @property
    def throughput(self) -> Path:
        return self.dir / THROUGHPUT_FILE

    def usage(self, job: str) -> Path:
        """``usage/<job>.json``: job = the kind, or ``analysis-<name>`` for an analysis."""
        return self.dir / USAGE_DIR / f"{job}.json"

    @property
    def row(self) -> Path:
        return row_file(self.root / RESULTS, self.grid, self.run_id)

    def sidecar(self, analysis: str) -> Path:
        return sidecar_file(self.root / RESULTS, self.grid, self.run_id, analysis)


def run_dir(runs_root: str | Path, grid: str, run_id: str) -> Path:
    """``<runs_root>/<grid>/<run_id>``: a run's folder under a ``runs/`` folder."""
    return Path(runs_root) / grid / run_id


def row_file(results_dir: str | Path, grid: str, run_id: str) -> Path:
    """``<results_dir>/runs/<grid>/<run_id>.parquet``: a run's result row."""
    return Path(results_dir) / RUNS / grid / f"{run_id}.parquet"


def sidecar_file(results_dir: str | Path, grid: str, run_id: str, analysis: str) -> Path:
    """``<results_dir>/runs/<grid>/<run_id>.<analysis>.npz``: an analysis job's arrays."""
    return Path(results_dir) / RUNS / grid / f"{run_id}.{analysis}.npz"


def grid_results(results_dir: str | Path, grid: str) -> Path:
    """``<results_dir>/<grid>.parquet``: the merge of a grid's rows."""
    return Path(results_dir) / f"{grid}.parquet"


def run_log(logs_dir: str | Path, grid: str, run_id: str, job: str) -> Path:
    """``<logs_dir>/<grid>/<run_id>/<job>.log``: a rule's log of one job of a run."""
    return Path(logs_dir) / grid / run_id / f"{job}.log"


def job_folder(slurm_logs: str | Path, grid: str, run_id: str, kind: str) -> Path:
    """``<slurm_logs>/<grid>/<run_id>/<kind>/``: submitit's folder of one job of a run (its
    ``job.json`` record, stdout/stderr, result)."""
    return Path(slurm_logs) / grid / run_id / kind


def grid_log_pattern(job: str) -> str:
    """``logs/{grid}/<job>.log``: the log of a grid's own job (its merge), as a rule's ``log:``."""
    return f"{LOGS}/{{grid}}/{job}.log"
