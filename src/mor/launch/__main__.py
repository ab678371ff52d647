"""``python -m mor.launch <kind> ...``: the thin launcher every job rule runs (layer: launch).

    train | eval | lmeval | analysis | throughput
                   run one job of one run: inline (``--launcher local``), or as a Slurm job
                   through submitit (``--launcher slurm``), waiting for it and failing with
                   the Slurm log path in the message if it fails. What each kind runs, its
                   preset and its outputs come from the one table ``mor.jobs.KINDS``; both
                   launchers call the same domain function, the Slurm one through the one
                   generic wrapper ``mor.launch.checkpointable.Job``
    data           prepare FineWeb-Edu (``mor.data.fineweb``): inline on every CPU here, or as a
                   CPU Slurm job with the preset file's ``data`` entry
    hub            fill the shared Hugging Face cache (hub tokenizers, lm-eval datasets) on this
                   node, which must reach the hub; every other kind runs offline
    plan           dry run: the data job (tokens, CPU-hours), jobs per kind, GPU-hours per
                   table, run ids (nothing submitted)

With the Slurm launcher the job's resources come from the preset for the run's scale and
the job kind (``--presets``, default slurm/presets.yaml); its submitit folder, Slurm logs
and ``job.json`` / ``result.json`` go to ``logs/slurm/runs/<run_id>/<kind>/`` (``mor.layout.job_folder``). This
process stays light (no torch): Snakemake runs many of them side by side on a login node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from pathlib import Path

from mor.layout import SLURM_LOGS, RunPaths, job_folder
from mor.atomic import write_text_atomic
from mor.errors import is_domain_error, one_line
from mor.data.fineweb import SettingsError
from mor.grids import GridError, load_grid
from mor.jobs import KINDS, RUN_KINDS, import_kind
from mor.launch.lease import LeaseError
from mor.launch.presets import DEFAULT_PRESETS, PresetError, load_presets
from mor.launch.slurm_submit import LaunchError
from mor.lm_eval.hub_cache import HubCacheError
from mor.train.stop import Preempted


def log_dir(root: str, grid_name: str, run_id: str, kind: str) -> Path:
    return job_folder(root, grid_name, run_id, kind)


def add_job_arguments(p: argparse.ArgumentParser, kind: str, threads_help: str) -> None:
    """The arguments of one job of one run (every kind of ``mor.jobs.RUN_KINDS``)."""
    p.add_argument("--grid", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--mode", default="local")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--data-root", default="data")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help=threads_help)
    if kind != "train":
        p.add_argument("--out", required=True)
    if kind == "analysis":
        from mor.analysis.sidecar import ANALYSES

        p.add_argument("--analysis", required=True, choices=ANALYSES, help="what to measure (mor.analysis.job)")
    if kind == "eval":
        p.add_argument("--eval-settings", metavar="HASH", help="with --grid a folder of grids: the listing whose "
                       "eval settings have this hash (RunConfig.eval_hash; one eval job per distinct settings)")
    if kind == "lmeval":
        p.add_argument("--tasks-dir", help="converted offline tasks (default <data-root>/lm_eval/tasks)")


def job_kwargs(a, threads: int, preset=None) -> dict:
    """The keyword arguments of one run's job of kind ``a.kind``: absolute paths and plain values,
    the same inline and in a Slurm job's pickle."""
    kw = dict(grid=str(Path(a.grid).absolute()), run_id=a.run_id, mode=a.mode,
              run_dir=str(Path(a.run_dir).absolute()), data_root=str(Path(a.data_root).absolute()),
              device=a.device, threads=threads)
    if a.kind != "train":
        kw["out"] = str(Path(a.out).absolute())
    if a.kind == "analysis":
        kw["analysis"] = a.analysis
    if a.kind == "lmeval":
        kw["tasks_dir"] = str(Path(a.tasks_dir).absolute()) if a.tasks_dir else None
    if a.kind == "train" and preset is not None:
        kw.update(parallel=preset.parallel, peak_tflops=preset.peak_tflops_per_gpu if preset.gpus_per_node else 0.0,
                  execution=dict(preset.execution),  # how it computes (mor.config.ExecConfig), not its identity
                  live_curves=preset.live_curves)  # mor.train.live_curves; $MOR_LIVE_CURVES wins (any launcher)
    return kw


PREEMPTED_EXIT = 75  # EX_TEMPFAIL: stopped by a signal with its checkpoint saved; the same command resumes


def _local(a, spec=None) -> int:
    """In this process; a train job is never distributed here (a local run inside an salloc stays one process).
    SIGTERM / SIGUSR2 stop a train job at the end of its step with a checkpoint (``mor.train.stop``).
    Under a workflow the job stops when its Snakemake is gone, and a train job holds its run
    folder's writer lock while it runs (``mor.launch.lease``): never two writers on one run."""
    from mor.launch.lease import run_lease, watch_workflow

    spec = spec or KINDS[a.kind]
    watch_workflow()
    lease = run_lease(Path(a.run_dir), what=f"{a.kind} job") if a.kind == "train" else contextlib.nullcontext()
    started = time.monotonic()
    try:
        with lease:
            r = spec.run(**job_kwargs(a, a.threads))
    except Preempted as e:
        _usage(a, started, finished=False)
        print(f"error: {a.kind} of {a.run_id}: {e}", file=sys.stderr)
        return PREEMPTED_EXIT
    _usage(a, started, finished=True)
    print(spec.summarise(r))
    return 0


def _usage(a, started: float, finished: bool) -> None:
    """The job's CPU and wall seconds into its run folder (``mor.usage``; read by ``mor status``).
    The CPU count starts at the process's own start, imports included: that is what the job cost."""
    from mor import usage

    job = usage.job_name(a.kind, getattr(a, "analysis", ""), getattr(a, "eval_settings", None) or "")
    try:
        usage.record(RunPaths.of(a.run_dir).usage(job), usage.cpu_seconds(), time.monotonic() - started,
                     a.threads, finished)
    except OSError as e:  # the job's result is written: a full disk must not fail it for its bookkeeping
        print(f"warning: {a.kind} of {a.run_id}: its CPU time was not recorded ({e})", file=sys.stderr)


def _submit(kind: str, kwargs: dict, preset, folder: Path, name: str, what: str) -> list[dict] | None:
    """Submit ``kind`` as a Slurm job through the one generic wrapper and wait for its ranks' results
    (None: handed to the workflow's watcher, ``mor.launch.slurm_handoff.run_or_hand_off``)."""
    from mor.launch.checkpointable import Job
    from mor.launch.slurm_handoff import run_or_hand_off
    from mor.launch.slurm_submit import pythonpath_setup

    results = run_or_hand_off(Job(kind, kwargs), preset, folder, name=name, what=what, setup=pythonpath_setup())
    if results is None:
        return None
    write_text_atomic(folder / "result.json", json.dumps(results, indent=2, default=str))
    return results


def _slurm(a) -> int:
    grid = load_grid(a.grid, a.mode)
    run = grid.run(a.run_id).config
    spec = KINDS[a.kind]
    preset = load_presets(a.presets).get(run.model.scale, spec.preset)
    from mor.launch.cost import PLANNED, timed_preset

    if a.kind in PLANNED:  # the job's own time limit, as the plan prints it (mor.launch.cost.time_limit_min)
        preset = timed_preset(run, a.kind, preset, getattr(a, "analysis", "") or "", grid.mode)
    folder = log_dir(a.log_root, grid.name, a.run_id, a.kind).absolute()
    if a.kind == "analysis":
        folder = folder.with_name(f"analysis-{a.analysis}")
    if a.kind == "eval":  # one eval job per distinct eval settings of the run (mor.listings)
        folder = folder.with_name(f"eval-{run.eval_hash}")
    what = f"{a.kind} of {grid.name}/{a.run_id}"
    results = _submit(a.kind, job_kwargs(a, preset.cpus_per_task, preset), preset, folder,
                      name=f"mor-{a.kind}-{a.run_id}", what=what)
    if results is None:  # submitted; the workflow's watcher collects it
        return 0
    prints = {r.get("param_fingerprint") for r in results}
    if len(results) > 1 and len(prints) != 1:
        raise LaunchError(f"{what}: the {len(results)} ranks finished with different parameters "
                          f"({sorted(map(str, prints))}); see {folder / 'result.json'}")
    print(spec.summarise(results[0]))
    return 0


def _full_run_id(a) -> None:
    """A run id typed as a unique prefix (``mor status`` shows them) -> the whole id, in
    ``--run-id`` and in a ``--run-dir`` named by the same prefix. The workflow passes whole ids
    (ending in the 8-hex config hash), which are taken as they are without opening the grid."""
    if re.search(r"-[0-9a-f]{8}$", a.run_id):
        return
    full = load_grid(a.grid, a.mode).find(a.run_id).run_id
    if Path(a.run_dir).name == a.run_id:
        a.run_dir = str(Path(a.run_dir).with_name(full))
    a.run_id = full


def _home_grid(a) -> None:
    """``--grid`` a folder of grids (the workflow's rules of a run's own jobs): the grid file of
    the run's home listing for this kind (``mor.listings``), whichever grids list it."""
    if Path(a.grid).is_dir():
        from mor.listings import find_home

        which = getattr(a, "eval_settings", None) or getattr(a, "analysis", None) or ""
        a.grid = str(find_home(a.grid, a.mode, a.run_id, a.kind, which).path)


def _job(a) -> int:
    _home_grid(a)
    _full_run_id(a)
    if a.kind == "train" and _imports(a):  # the authors' weights, imported here: nothing to train, no GPU
        return _local(a, KINDS["import"])
    return _slurm(a) if a.launcher == "slurm" else _local(a)


def _imports(a) -> bool:
    """The run's train job is an import (``model.import_checkpoint``; mor.jobs.import_kind)."""
    return import_kind("train", load_grid(a.grid, a.mode).run(a.run_id).config) == "import"


def _data(a) -> int:
    """The FineWeb-Edu preparation: same settings, same code inline and on Slurm."""
    from mor.data.fineweb import DEFAULT_SETTINGS, load_settings

    a.settings = a.settings or str(DEFAULT_SETTINGS)
    load_settings(a.settings)  # a bad file fails here (exit 2), not in a queued job
    out = Path(a.out).absolute()
    spec = KINDS["data"]
    kwargs = dict(settings=str(Path(a.settings).absolute()), tokenizer=a.tokenizer, out=str(out), workers=a.workers)
    if a.launcher != "slurm":
        print(spec.summarise(spec.run(**kwargs)))
        return 0
    preset = load_presets(a.presets).data  # the top-level `data:` entry (spec.preset)
    kwargs["workers"] = a.workers or preset.cpus_per_task
    folder = (Path(a.log_root) / "data" / out.name).absolute()
    results = _submit("data", kwargs, preset, folder, name=f"mor-data-{out.name}", what=f"data preparation {out.name}")
    if results is None:  # submitted; the workflow's watcher collects it
        return 0
    print(spec.summarise(results[0]))
    return 0


def _hub(a) -> int:
    """Fill the shared hub cache here (never on Slurm: it runs where the hub can be reached)."""
    spec = KINDS["hub"]
    print(spec.summarise(spec.run(out=str(Path(a.out).absolute()), tokenizers=a.tokenizer or [], tasks=a.task or [])))
    return 0


def _plan(a) -> int:
    from mor.data.fineweb import DEFAULT_SETTINGS
    from mor.launch.cost import plan_grid
    from mor.grids import all_grids
    from mor.launch.plan import format_campaign, format_data_plan, format_design, format_plan, format_site

    a.fineweb = a.fineweb or DEFAULT_SETTINGS
    # a folder of grids (`--grid grids`, the paper): every grid file in it
    a.grid = [str(p) for g in a.grid for p in (all_grids(Path(g)) if Path(g).is_dir() else [Path(g)])]

    presets = load_presets(a.presets)
    print(format_site(presets))  # first: which GPUs the hours are priced on
    data = format_data_plan([load_grid(path, a.mode) for path in a.grid], presets, a.fineweb, a.data_root, a.tags)
    if data:
        print(data)
        print()
    planned = {}
    for path in a.grid:
        grid = load_grid(path, a.mode)
        jobs = plan_grid(grid, presets, a.tags)
        planned[grid.name] = (grid, jobs)
        print(format_plan(grid, jobs, presets))
        print()
    if len(a.grid) > 1:  # each distinct run once (one home per run id), and what that saves
        print(format_campaign(planned, presets))
    design = format_design(planned) if a.mode == "cluster" else ""
    if design:
        print()
        print(design)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mor.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for kind in RUN_KINDS:
        p = sub.add_parser(kind, help=f"run one {kind} job (inline or on Slurm)")
        add_job_arguments(p, kind, threads_help="CPU threads inline (Slurm: the preset's cpus_per_task)")
        p.add_argument("--launcher", choices=("local", "slurm"), default="local")
        p.add_argument("--presets", default=str(DEFAULT_PRESETS))
        p.add_argument("--log-root", default=SLURM_LOGS, help="submitit folders: <root>/<grid>/<run_id>/<kind>")
        p.set_defaults(fn=_job, kind=kind)

    p = sub.add_parser("data", help="prepare FineWeb-Edu token shards (inline or a CPU Slurm job)")
    p.add_argument("--settings", default="", help="the preparation's YAML; '' = workflows/config/fineweb.yaml")
    p.add_argument("--tokenizer", required=True, help="hub tokenizer name, or a tokenizer .json")
    p.add_argument("--out", required=True, help="folder for val/ and train/ (shards + manifest.json)")
    p.add_argument("--workers", type=int, default=0, help="tokenizer processes; 0 = every CPU (Slurm: cpus_per_task)")
    p.add_argument("--launcher", choices=("local", "slurm"), default="local")
    p.add_argument("--presets", default=str(DEFAULT_PRESETS))
    p.add_argument("--log-root", default=SLURM_LOGS, help="submitit folder: <root>/data/<out folder name>")
    p.set_defaults(fn=_data)

    p = sub.add_parser("hub", help="fill the shared Hugging Face cache (tokenizers, lm-eval datasets) on this node")
    p.add_argument("--out", required=True, help="the manifest to write once everything is cached")
    p.add_argument("--tokenizer", action="append", help="hub tokenizer name (repeatable)")
    p.add_argument("--task", action="append", help="lm-eval task whose dataset to cache (repeatable)")
    p.set_defaults(fn=_hub)

    p = sub.add_parser("plan", help="dry run: jobs, GPU-hours and run ids per grid")
    p.add_argument("--grid", required=True, action="append", help="grid file (repeatable), or a folder of them (grids: the paper)")
    p.add_argument("--mode", default="cluster")
    p.add_argument("--presets", default=str(DEFAULT_PRESETS))
    p.add_argument("--tags", nargs="*")
    p.add_argument("--fineweb", help="FineWeb-Edu preparation settings (default workflows/config/fineweb.yaml)")
    p.add_argument("--data-root", default="data", help="where prepared tokens are looked for")
    p.set_defaults(fn=_plan)

    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except (GridError, PresetError, SettingsError, HubCacheError, LeaseError) as e:  # before anything ran
        print(one_line(e), file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a job that failed on a domain or file-system error: one line
        if not (is_domain_error(e) or isinstance(e, OSError)):
            raise  # a bug: its traceback is what a fix needs
        print(one_line(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
