"""Where a run's files live: the one place that spells the run-folder layout.

Every job, reader, report and Snakemake rule finds a run's files through this module, so
changing the layout is an edit here, not a hunt (``tests/unit/test_layout.py`` fails when another
module spells a pattern again). Torch-free and pure: paths only, nothing is read or created.

A run has one home, keyed by its id alone (the id is the identity of what it trains, issue 29):
however many grids list it, it is trained once, and its lm-eval, throughput and analysis jobs
run once. Its eval job runs once per distinct eval settings (``RunConfig.eval_hash``): two grids
that score it alike share one measurement, two that score it differently get one each. Only its
result row is the grid's (the measurement with the grid, its label and its config; the ``row``
rule, ``mor.eval.row``): ``GRID_KINDS``. ``mor.migrate`` moves a folder of the layout before
(``runs/<grid>/<run_id>``, ``legacy_run_dir``) into this one.

    runs/<run_id>/                             RunPaths(grid, run_id).dir
        config.json                            .config         resolved config + git commit
        train_log.jsonl                        .train_log      one JSON line per step
        checkpoints/step-<n>/                  .checkpoints
        final/model.safetensors                .final, .weights
        final/summary.json                     .final_summary  kept copy of the marker
        train_summary.json                     .summary        written last: the run trained
        eval/<eval_hash>.parquet               .measurement(h) the eval job's measurement (per eval settings)
        lm_eval.json                           .lm_eval        the lmeval job's output
        throughput.json                        .throughput     the throughput job's output
        usage/<job>.json                       .usage(job)     what a local job cost (mor.usage; eval-<eval_hash>.json for eval)
    results/runs/<grid>/<run_id>.parquet       .row            the run's result row (the grid's: rule row)
    results/runs/<run_id>.<a>.npz              .sidecar(a)     an analysis job's arrays
    results/<grid>.parquet                     grid_results(grid)
    logs/runs/<run_id>/<job>.log               run_log(logs, grid, run_id, job): a rule's log
    logs/runs/<run_id>/eval-<eval_hash>.log    .. of an eval job (one per eval settings)
    logs/<grid>/<run_id>/row.log               .. of a job of GRID_KINDS
    logs/slurm/runs/<run_id>/<kind>/           job_folder(logs/slurm, ...): submitit's folder,
        job.json                               .. with the Slurm job's record (eval-<eval_hash>/ for eval)

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
EVAL_DIR = "eval"  # eval/<eval_hash>.parquet: the eval job's measurement, one per eval settings
LM_EVAL_FILE = "lm_eval.json"
THROUGHPUT_FILE = "throughput.json"
USAGE_DIR = "usage"  # usage/<job>.json: a local job's CPU and wall seconds (mor.usage)

# Jobs whose output depends on the grid that lists the run: its result row (the row rule, the
# eval measurement with the grid's label and config; no job kind of mor.jobs). Every job kind
# of a run is the run's own, keyed by the run id (and an eval job by its eval settings' hash).
GRID_KINDS = ("row",)
SHARED_LOGS = RUNS  # logs/runs/<run_id>/, logs/slurm/runs/<run_id>/: a run's own jobs' logs

RUN_PATTERN = f"{RUNS}/{{run_id}}"
SUMMARY_PATTERN = f"{RUN_PATTERN}/{SUMMARY_FILE}"
MEASUREMENT_PATTERN = f"{RUN_PATTERN}/{EVAL_DIR}/{{eval_hash}}.parquet"
LM_EVAL_PATTERN = f"{RUN_PATTERN}/{LM_EVAL_FILE}"
THROUGHPUT_PATTERN = f"{RUN_PATTERN}/{THROUGHPUT_FILE}"
ROW_PATTERN = f"{RESULTS}/{RUNS}/{{grid}}/{{run_id}}.parquet"
SIDECAR_PATTERN = f"{RESULTS}/{RUNS}/{{run_id}}.{{analysis}}.npz"
GRID_RESULTS_PATTERN = f"{RESULTS}/{{grid}}.parquet"


def by_grid(job: str) -> bool:
    """Whether a job of a run (a kind, or ``analysis-<name>``) is the grid's (``GRID_KINDS``),
    not the run's own."""
    return job.split("-")[0] in GRID_KINDS


def run_log_pattern(job: str) -> str:
    """``logs/runs/{run_id}/<job>.log`` (``logs/{grid}/{run_id}/<job>.log`` for a job of
    ``GRID_KINDS``): the log of one job of a run, as a rule's ``log:``."""
    return str(run_log(LOGS, "{grid}", "{run_id}", job))


@dataclass(frozen=True)
class RunPaths:
    """The files of run ``run_id`` under ``root`` (the repository root, or wherever ``runs/``
    and ``results/`` live), as grid ``grid`` lists it: the grid decides only ``row``, the one
    file of ``GRID_KINDS``. ``RunPaths.of(run_dir)`` starts from a run folder that was passed
    in (``--run-dir runs/<id>``), wherever it is; its grid is None (no row)."""

    grid: str | None
    run_id: str
    root: Path = Path(".")
    run_dir: Path | None = None  # set by ``of``: a run folder outside <root>/runs/

    @classmethod
    def of(cls, run_dir: str | Path, results_root: str | Path = ".") -> "RunPaths":
        d = Path(run_dir)
        return cls(grid=None, run_id=d.name, root=Path(results_root), run_dir=d)

    @classmethod
    def own(cls, run_id: str, root: str | Path = ".") -> "RunPaths":
        """The run's own files, whatever grid lists it (no row)."""
        return cls(grid=None, run_id=run_id, root=Path(root))

    @property
    def dir(self) -> Path:
        return self.run_dir if self.run_dir is not None else run_dir(self.root / RUNS, self.run_id)

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

    def measurement(self, eval_hash: str) -> Path:
        """``eval/<eval_hash>.parquet``: the eval job's measurement under eval settings of that
        hash (``RunConfig.eval_hash``), whatever grids list the run with them."""
        return self.dir / EVAL_DIR / f"{eval_hash}.parquet"

    @property
    def lm_eval(self) -> Path:
        return self.dir / LM_EVAL_FILE

    @property
    def throughput(self) -> Path:
        return self.dir / THROUGHPUT_FILE

    def usage(self, job: str) -> Path:
        """``usage/<job>.json``: job = the kind, ``analysis-<name>`` for an analysis, ``eval-<eval_hash>``
        for an eval job of those settings (``mor.usage.job_name``)."""
        return self.dir / USAGE_DIR / f"{job}.json"

    @property
    def row(self) -> Path:
        if self.grid is None:
            raise ValueError(f"run {self.run_id}: a result row is a grid's; RunPaths.of(run_dir) names no grid")
        return row_file(self.root / RESULTS, self.grid, self.run_id)

    def sidecar(self, analysis: str) -> Path:
        return sidecar_file(self.root / RESULTS, self.run_id, analysis)


def run_dir(runs_root: str | Path, run_id: str) -> Path:
    """``<runs_root>/<run_id>``: a run's folder under a ``runs/`` folder, whatever grids list it."""
    return Path(runs_root) / run_id


def legacy_run_dir(runs_root: str | Path, grid: str, run_id: str) -> Path:
    """``<runs_root>/<grid>/<run_id>``: where a run lived before it had one home (``mor.migrate``)."""
    return Path(runs_root) / grid / run_id


def legacy_sidecar_file(results_dir: str | Path, grid: str, run_id: str, analysis: str) -> Path:
    """``<results_dir>/runs/<grid>/<run_id>.<analysis>.npz``: an analysis file before (``mor.migrate``)."""
    return Path(results_dir) / RUNS / grid / f"{run_id}.{analysis}.npz"


def legacy_job_folder(slurm_logs: str | Path, grid: str, run_id: str, kind: str) -> Path:
    """``<slurm_logs>/<grid>/<run_id>/<kind>/``: a run's Slurm job folder before (``mor.migrate``)."""
    return Path(slurm_logs) / grid / run_id / kind


def row_file(results_dir: str | Path, grid: str, run_id: str) -> Path:
    """``<results_dir>/runs/<grid>/<run_id>.parquet``: a run's result row."""
    return Path(results_dir) / RUNS / grid / f"{run_id}.parquet"


def sidecar_file(results_dir: str | Path, run_id: str, analysis: str) -> Path:
    """``<results_dir>/runs/<run_id>.<analysis>.npz``: an analysis job's arrays (the run's own)."""
    return Path(results_dir) / RUNS / f"{run_id}.{analysis}.npz"


def grid_results(results_dir: str | Path, grid: str) -> Path:
    """``<results_dir>/<grid>.parquet``: the merge of a grid's rows."""
    return Path(results_dir) / f"{grid}.parquet"


def run_log(logs_dir: str | Path, grid: str, run_id: str, job: str) -> Path:
    """``<logs_dir>/runs/<run_id>/<job>.log``, or ``<logs_dir>/<grid>/<run_id>/<job>.log`` for a
    job of ``GRID_KINDS``: a rule's log of one job of a run."""
    return Path(logs_dir) / (grid if by_grid(job) else SHARED_LOGS) / run_id / f"{job}.log"


def job_folder(slurm_logs: str | Path, grid: str, run_id: str, kind: str) -> Path:
    """``<slurm_logs>/runs/<run_id>/<kind>/`` (``<slurm_logs>/<grid>/<run_id>/<kind>/`` for a
    kind of ``GRID_KINDS``): submitit's folder of one job of a run (its ``job.json`` record,
    stdout/stderr, result)."""
    return Path(slurm_logs) / (grid if by_grid(kind) else SHARED_LOGS) / run_id / kind


def grid_log_pattern(job: str) -> str:
    """``logs/{grid}/<job>.log``: the log of a grid's own job (its merge), as a rule's ``log:``."""
    return f"{LOGS}/{{grid}}/{job}.log"
