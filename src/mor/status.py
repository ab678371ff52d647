"""``python -m mor status [targets or grids]``: where every run the targets need stands.

One table per grid, one row per run, then a summary line per grid and the device-hours:

    state       done          the eval job wrote results/runs/<grid>/<id>.parquet (val NLL shown)
                trained       train_summary.json exists, the eval job has not written its row
                running       Slurm says RUNNING, or (local) train_log.jsonl grew recently
                queued        Slurm says PENDING (or requeued, configuring, suspended)
                failed        Slurm says it ended without the run finishing, or the rule's log
                              (logs/<grid>/<id>/train.log) ends in an error: its last error line
                stopped       part-trained, nothing writing: the next workflow run resumes it
                              (at the newest checkpoints/step-N, shown)
                not started   nothing on disk yet
    progress    step / total steps (train_log.jsonl, whose last line is the last logged step)
    tok/s, ETA  mean tokens/s of the last logged steps; ETA = steps left at that speed. Runs
                that have not started show the plan's estimate instead (``~``)
    loss        last training loss; val NLL of finished runs

Device-hours come from the plan the launcher prints (``mor.launch.plan.plan_grid`` over the
Slurm presets): a finished job counts whole, a training job in progress by its fraction of
steps, the rest is left. Slurm's state comes from the launcher's own queries
(``mor.launch.slurm.slurm_state``) for the job id it recorded in
``logs/slurm/<grid>/<id>/<kind>/job.json``; without Slurm clients those answer "unknown" and
the files decide. Status only reads: it never writes a file, so it runs beside a workflow.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from mor.grids import Grid, GridError, all_grids, load_grid

TAIL_BYTES = 64 * 1024  # enough for the last few hundred log lines
SPEED_WINDOW = 20  # logged steps averaged for tokens/s
STALE_MIN_S = 300.0  # a local log older than max(this, 20 steps) is not being written
QUEUED = {"PENDING", "REQUEUED", "CONFIGURING", "SUSPENDED", "PREEMPTED", "READY", "RESIZING"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT"}
STATES = ("done", "trained", "running", "queued", "failed", "stopped", "not started")
STYLE = {"done": "green", "trained": "cyan", "running": "bold yellow", "queued": "blue", "failed": "bold red",
         "stopped": "magenta", "not started": "dim"}
_ERROR = re.compile(r"(\w*(Error|Exception|Interrupt)\b|^error:|Traceback|Killed|CANCELLED|TIMEOUT)")


@dataclass(frozen=True)
class Paths:
    """Where the workflow keeps what status reads (all relative to the repository root)."""

    runs: Path = Path("runs")
    results: Path = Path("results")
    logs: Path = Path("logs")
    slurm_logs: Path = Path("logs/slurm")

    def run_dir(self, grid: str, run_id: str) -> Path:
        return self.runs / grid / run_id

    def result(self, grid: str, run_id: str) -> Path:
        return self.results / "runs" / grid / f"{run_id}.parquet"

    def rule_log(self, grid: str, run_id: str, kind: str) -> Path:
        return self.logs / grid / run_id / f"{kind}.log"

    def slurm_job(self, grid: str, run_id: str, kind: str) -> Path:
        return self.slurm_logs / grid / run_id / kind / "job.json"


@dataclass
class RunStatus:
    grid: str
    run_id: str
    label: str
    state: str
    steps: int
    step: int = 0
    tokens_per_s: float | None = None
    eta_s: float | None = None
    estimated: bool = False  # eta_s is the plan's estimate, not a measurement
    loss: float | None = None
    val_nll: float | None = None
    note: str = ""
    hours_total: float = 0.0  # device-hours of the run's planned jobs
    hours_spent: float = 0.0


@dataclass
class GridStatus:
    grid: Grid
    runs: list[RunStatus] = field(default_factory=list)
    device: str = "GPU"  # "CPU" when the presets run this grid's jobs on CPUs (hours per task)
    no_plan: str = ""  # why the presets give no hours for this grid (then none are shown)

    def counts(self) -> dict[str, int]:
        return {s: n for s in STATES if (n := sum(r.state == s for r in self.runs))}


# --------------------------------------------------------------------------------------
# Which grids the targets need
# --------------------------------------------------------------------------------------
def resolve_targets(targets: list[str], grids_dir: Path, mode: str) -> list[Grid]:
    """Grids for Snakemake targets (tables/x, figures/y, paper), grid names or grid files;
    none = every grid that lists an artifact."""
    grids = {p.stem: load_grid(p, mode) for p in all_grids(grids_dir)}
    by_artifact = {a: g.name for g in grids.values() for a in g.artifacts}
    picked: list[str] = []
    for t in targets or ["paper"]:
        t = t.rstrip("/")
        if t in ("paper", "all"):
            names = [g.name for g in grids.values() if g.artifacts]
        elif t in by_artifact:
            names = [by_artifact[t]]
        elif t in grids:
            names = [t]
        elif t.endswith(".yaml") and Path(t).exists():
            g = load_grid(t, mode)
            grids.setdefault(g.name, g)
            names = [g.name]
        else:
            raise GridError(f"unknown target {t!r}: not an artifact of a grid in {grids_dir} ({sorted(by_artifact)}), "
                            f"a grid name ({sorted(grids)}), a grid file or 'paper'")
        picked += [n for n in names if n not in picked]
    return [grids[n] for n in picked]


def with_design_seeds(grids: list[Grid], results: Path) -> list[Grid]:
    """The grids with the seeds the claims' adaptive design has added so far: the latest
    ``results/claims/round<r>/plan.json`` (workflows/claims.smk) names, per grid and block,
    the seeds its next round trains, so those runs are listed too (as not started until
    they run)."""
    import json

    plans = [p for p in (results / "claims").glob("round*/plan.json") if p.parent.name[5:].isdigit()]
    plans.sort(key=lambda p: int(p.parent.name[5:]))
    if not plans:
        return grids
    try:
        seeds = json.loads(plans[-1].read_text())["seeds"]
    except (OSError, ValueError, KeyError) as e:
        raise GridError(f"{plans[-1]}: not a round plan of the claims' design ({e})") from None
    return [load_grid(g.path, g.mode, seeds=seeds[g.name]) if seeds.get(g.name) else g for g in grids]


# --------------------------------------------------------------------------------------
# Reading a run's files
# --------------------------------------------------------------------------------------
def log_tail(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict]:
    """The complete JSON lines at the end of a train log (a torn last line is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            blob = f.read()
    except OSError:
        return []
    lines = blob.decode("utf-8", "replace").splitlines()
    if size > max_bytes:
        lines = lines[1:]  # the first line read is probably cut
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            out.append(rec)
    return out


def last_error_line(path: Path) -> str | None:
    """The last line of a log that reads like an error (None without one, or without the log)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    hits = [ln for ln in lines if _ERROR.search(ln)]
    return hits[-1][:200] if hits else None


def slurm_job_state(record: Path, query=None) -> tuple[str, str] | None:
    """(Slurm state, job id) of the job the launcher recorded, None without a record. The
    state is "" when neither sacct nor squeue can say."""
    try:
        job_id = str(json.loads(record.read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if query is None:
        from mor.launch.slurm import slurm_state as query
    return query(job_id).state, job_id


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's newest checkpoint (``checkpoints/step-NNNNNN``), where a restarted
    job resumes; None without one."""
    steps = []
    for d in (run_dir / "checkpoints").glob("step-*"):
        try:
            steps.append(int(d.name.removeprefix("step-")))
        except ValueError:
            continue
    return max(steps, default=None)


def read_val_nll(path: Path) -> float | None:
    from mor.results import ResultsError, read_rows

    try:
        rows = read_rows(path).to_pylist()
    except ResultsError:
        return None
    return rows[0].get("val_nll") if rows else None


def run_status(grid: Grid, run, paths: Paths, now: float, slurm_query=None) -> RunStatus:
    """The state of one run from its files and (when a job was recorded) Slurm."""
    cfg = run.config
    st = RunStatus(grid.name, run.run_id, cfg.label, "not started", cfg.train.steps)
    run_dir = paths.run_dir(grid.name, run.run_id)
    tail = log_tail(run_dir / "train_log.jsonl")
    if tail:
        last = tail[-1]
        st.step, st.loss = int(last["step"]), last.get("loss")
        speeds = [r["tokens_per_s"] for r in tail[-SPEED_WINDOW:] if r.get("tokens_per_s")]
        if speeds:
            st.tokens_per_s = statistics.fmean(speeds)
    if paths.result(grid.name, run.run_id).exists():
        st.state, st.step, st.val_nll = "done", st.steps, read_val_nll(paths.result(grid.name, run.run_id))
        return st
    summary = run_dir / "train_summary.json"
    if summary.exists():
        st.state, st.step = "trained", st.steps
        job = slurm_job_state(paths.slurm_job(grid.name, run.run_id, "eval"), slurm_query)
        st.note = f"eval: Slurm {job[0]} (job {job[1]})" if job and job[0] else "eval pending"
        return st
    job = slurm_job_state(paths.slurm_job(grid.name, run.run_id, "train"), slurm_query)
    error = last_error_line(paths.rule_log(grid.name, run.run_id, "train"))
    if job and job[0]:
        state, job_id = job
        if state in RUNNING:
            st.state, st.note = "running", f"Slurm job {job_id}"
        elif state in QUEUED:
            st.state, st.note = "queued", f"Slurm job {job_id} {state}"
        else:
            st.state = "failed" if state != "COMPLETED" else "stopped"
            st.note = f"Slurm job {job_id} {state}" + (f": {error}" if error else "")
        return st
    log = run_dir / "train_log.jsonl"
    if tail:
        step_s = cfg.train.tokens_per_step / st.tokens_per_s if st.tokens_per_s else 0.0
        fresh = now - log.stat().st_mtime < max(STALE_MIN_S, 20 * step_s)
        ckpt = checkpoint_step(run_dir)
        resume = f"resumes at step {ckpt} (checkpoint)" if ckpt else "restarts from step 0 (no checkpoint yet)"
        if fresh:
            st.state = "running"
        elif error:
            st.state, st.note = "failed", f"{error}; {resume}"
        else:
            st.state, st.note = "stopped", resume
        return st
    if error:
        st.state, st.note = "failed", error
    return st


def plan_hours(grids: list[Grid], presets_file: Path | None) -> tuple[dict, str]:
    """(grid, run id) -> {job kind: (wall hours, device-hours)} from the launcher's plan, and
    the device word ("GPU", or "CPU" when no planned job has a GPU)."""
    from mor.launch.plan import plan_grid
    from mor.launch.slurm import load_presets

    presets = load_presets(presets_file) if presets_file else load_presets()
    out: dict[tuple[str, str], dict[str, float]] = {}
    gpus = False
    for g in grids:
        for j in plan_grid(g, presets):
            devices = j.gpus or j.world_size
            gpus |= j.gpus > 0
            out.setdefault((g.name, j.run_id), {})[j.kind] = (j.hours, j.hours * devices)
    return out, "GPU" if gpus else "CPU"


def collect(grids: list[Grid], paths: Paths = Paths(), presets_file: Path | None = None, tags: list[str] | None = None,
            slurm_query=None, now: float | None = None) -> list[GridStatus]:
    """The status of every run of ``grids`` (the ``tags`` blocks only, like the workflow)."""
    now = time.time() if now is None else now
    try:
        hours, device = plan_hours(grids, presets_file)
    except Exception as e:  # a site's broken presets must not hide the runs
        hours, device, no_plan = {}, "GPU", str(e)
    else:
        no_plan = ""
    out = []
    for g in grids:
        gs = GridStatus(g, device=device, no_plan=no_plan)
        for run in g.select(tags):
            st = run_status(g, run, paths, now, slurm_query)
            h = hours.get((g.name, run.run_id), {})
            if st.state == "running" and st.tokens_per_s:
                st.eta_s = (st.steps - st.step) * run.config.train.tokens_per_step / st.tokens_per_s
            st.hours_total = sum(device_h for _, device_h in h.values())
            train_wall, train_dev = h.get("train", (0.0, 0.0))
            if st.state == "done":
                st.hours_spent = st.hours_total
            elif st.state != "not started":  # trained: the eval job's hours are still left
                st.hours_spent = train_dev * min(1.0, st.step / max(1, st.steps))
            if st.state in ("not started", "queued") and train_wall:
                st.eta_s, st.estimated = train_wall * 3600, True
            gs.runs.append(st)
        out.append(gs)
    return out


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------
def _duration(s: float | None, estimated: bool = False) -> str:
    if s is None:
        return ""
    if s < 1:
        return "~<1s" if estimated else "<1s"
    s = int(round(s))
    text = f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
    return f"~{text}" if estimated else text


def _hours(h: float) -> str:
    return f"{h:.2f}" if h >= 0.1 or h == 0 else f"{h:.2g}"


def _num(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def render(statuses: list[GridStatus]):
    """A rich renderable: one table per grid, its summary line, and the total."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    parts = []
    total_spent = total_all = 0.0
    device = statuses[0].device if statuses else "GPU"
    for gs in statuses:
        t = Table(title=f"{gs.grid.name} ({gs.grid.mode}) -> {', '.join(gs.grid.artifacts) or 'no artifacts'}",
                  title_justify="left", expand=False, pad_edge=False)
        for name, kw in (("run", {"no_wrap": True}), ("state", {"no_wrap": True}), ("progress", {}), ("steps", {"justify": "right"}),
                         ("tok/s", {"justify": "right"}), ("ETA", {"justify": "right"}),
                         ("loss", {"justify": "right"}), ("val NLL", {"justify": "right"}), ("note", {})):
            t.add_column(name, **kw)
        for r in gs.runs:
            bar = ProgressBar(total=max(1, r.steps), completed=r.step, width=16,
                              complete_style="green" if r.state in ("done", "trained") else "yellow")
            t.add_row(r.run_id, Text(r.state, style=STYLE[r.state]), bar, f"{r.step}/{r.steps}",
                      _num(r.tokens_per_s, ".0f"), _duration(r.eta_s, r.estimated), _num(r.loss, ".3f"),
                      _num(r.val_nll, ".4f"), r.note)
        parts.append(t)
        spent = sum(r.hours_spent for r in gs.runs)
        whole = sum(r.hours_total for r in gs.runs)
        total_spent, total_all = total_spent + spent, total_all + whole
        counts = ", ".join(f"{n} {s}" for s, n in gs.counts().items())
        steps = sum(r.step for r in gs.runs), sum(r.steps for r in gs.runs)
        hours = (f"no hours: no plan from the presets ({gs.no_plan})" if gs.no_plan else
                 f"{gs.device}-hours {_hours(spent)} spent, {_hours(whole - spent)} left of {_hours(whole)} (plan)")
        parts.append(Text(f"{gs.grid.name}: {len(gs.runs)} runs: {counts}; steps {steps[0]}/{steps[1]}; {hours}\n"))
    if len(statuses) > 1:
        n = sum(len(gs.runs) for gs in statuses)
        done = sum(r.state == "done" for gs in statuses for r in gs.runs)
        hours = ("no hours (no plan from the presets)" if statuses[0].no_plan else
                 f"{device}-hours {_hours(total_spent)} spent, {_hours(total_all - total_spent)} left of "
                 f"{_hours(total_all)} (plan)")
        parts.append(Text(f"all: {done}/{n} runs done; {hours}", style="bold"))
    return Group(*parts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", help="Snakemake targets (tables/table10, figures/fig6, paper), grid names or "
                                              "grid files; default: every grid with artifacts")
    p.add_argument("--mode", default="local", help="grid mode: local (CPU scales) or cluster")
    p.add_argument("--tags", default="", help="comma-separated block tags, as --config tags=... (default: all runs)")
    p.add_argument("--grids-dir", default="grids")
    p.add_argument("--presets", default=None, help="Slurm presets for the plan (default slurm/presets.yaml)")
    p.add_argument("--root", default=".", help="the repository root holding runs/, results/ and logs/")
    p.add_argument("--watch", nargs="?", const=10.0, type=float, default=None, metavar="SECONDS",
                   help="refresh every SECONDS (default 10) until interrupted")


def main(a: argparse.Namespace) -> int:
    from rich.console import Console

    root = Path(a.root)
    paths = Paths(root / "runs", root / "results", root / "logs", root / "logs" / "slurm")
    grids_dir = Path(a.grids_dir) if Path(a.grids_dir).is_absolute() else root / a.grids_dir
    tags = [t for t in a.tags.split(",") if t]
    grids = with_design_seeds(resolve_targets(a.targets, grids_dir, a.mode), paths.results)
    presets = Path(a.presets) if a.presets else None
    console = Console() if Console().is_terminal else Console(width=220)  # piped: never wrap a row
    if a.watch is None:
        console.print(render(collect(grids, paths, presets, tags)))
        return 0
    from rich.live import Live

    with Live(render(collect(grids, paths, presets, tags)), console=console, screen=False,
              refresh_per_second=1) as live:
        try:
            while True:
                time.sleep(a.watch)
                live.update(render(collect(grids, paths, presets, tags)))
        except KeyboardInterrupt:
            pass
    return 0
