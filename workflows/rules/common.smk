# Helpers shared by the rule files. Defines no rules, and changes nothing when parsed (the
# Snakefile sets up the process: the import path, the stale-lock check).
import json
import shlex
import sys
from pathlib import Path

from mor.claims import CLAIMS
from mor.claims.registry import load_specs, spec_for
from mor.claims.rounds import round_grid
from mor.data.paths import data_paths, local_tokenizer
from mor.grids import all_grids, load_grid
from mor.jobs import KINDS  # what each job kind runs and writes (the rules' outputs)
from mor import layout  # the one spelling of the run-folder layout (RunPaths, the *_PATTERN strings)
from mor.listings import check_agree, home_of, listings
from mor.lm_eval import is_local_task
from mor.results import SCHEMA_VERSION, check_mode, run_list_hash
from mor.workflow_config import check_use, checked, stop, tag_list

MODE = config["mode"]
TAGS = tag_list(config["tags"])
DATA = Path(config["data_root"])
# PY, DATA and LAUNCH_ARGS are where and how jobs run, not what they compute: they stay out
# of `params:` so that switching interpreter or launcher (local <-> slurm) never retrains.
PY = f"{shlex.quote(sys.executable)} -m mor"  # quoted: a checkout path may hold spaces

# Where train / eval jobs run: inline (local) or as Slurm jobs through submitit (slurm;
# resources from the preset file, validated now so a bad preset fails before any job).
LAUNCHER = config.get("launcher", "local")
PRESETS = Path(config.get("presets") or Path(workflow.basedir) / "slurm" / "presets.yaml").absolute()
LAUNCH_ARGS = f"--launcher {LAUNCHER}"
# What the launcher rules say as `localrule`: a Slurm launcher goes to the profile's executor
# (mor-slurm: submit, then the one watcher); a local launcher, like all the other rules
# (`localrule` True), runs on the node Snakemake runs on.
LOCAL_LAUNCH = LAUNCHER != "slurm"
PRESET_TABLE = None  # the parsed preset file (launcher slurm): the rules' resources come from it
if LAUNCHER == "slurm":
    from mor.launch.presets import load_presets

    PRESET_TABLE = checked(load_presets, PRESETS)
    LAUNCH_ARGS += f" --presets {shlex.quote(str(PRESETS))}"

# Parse and validate every grid now: a malformed grid stops the workflow before any job.
GRIDS_DIR = Path(config["grids_dir"]).absolute()
GRIDS = {p.stem: checked(load_grid, p, MODE) for p in all_grids(GRIDS_DIR)}
checked(check_use, config, GRIDS)  # a --config key this profile cannot use is refused, not ignored
# One home per run id (mor.listings): a run several grids list trains once, its lm-eval,
# throughput and analysis jobs run once; the listings must agree on those jobs' settings.
RUN_LISTINGS = listings(GRIDS.values())
checked(check_agree, RUN_LISTINGS, MODE, ("lmeval", "analysis"))
ARTIFACT_GRID = {a: g.name for g in GRIDS.values() for a in g.artifacts}
ALL_ARTIFACTS = sorted(ARTIFACT_GRID)


wildcard_constraints:
    grid=r"[A-Za-z0-9_-]+",
    run_id=r"[A-Za-z0-9_.-]+",
    name=r"[A-Za-z0-9_-]+",
    vocab=r"\d+",
    round=r"\d+",  # the claims' adaptive design (workflows/rules/claims.smk)
    eval_hash=r"[0-9a-f]{12}",  # RunConfig.eval_hash: one eval job per distinct eval settings of a run


def grid_named(name):
    """The grid of a target's ``grid`` wildcard; an unknown one stops the workflow as one line."""
    if name not in GRIDS:
        stop(LookupError(f"no grid {name!r} in {GRIDS_DIR} (a target names it); grids: {sorted(GRIDS)}"))
    return GRIDS[name]


def grid_file(grid):
    return str(grid_named(grid).path)


_HOMES = {}  # (run id, kind, eval hash or analysis) -> run config: Snakemake asks once per input function per job


def run_config(wildcards, kind="train"):
    """The config of a job's run: as its grid lists it (a job of layout.GRID_KINDS, keyed by
    grid and run id), else from the home listing of the run's own job of ``kind`` (mor.listings;
    an eval job's: the first with the eval settings of its ``eval_hash``; an analysis job's: the
    first whose grid draws its ``analysis``)."""
    w = dict(wildcards.items())
    if "grid" in w:
        return checked(grid_named(wildcards.grid).run, wildcards.run_id).config
    key = (wildcards.run_id, kind, w.get("eval_hash") or w.get("analysis") or "")
    if key not in _HOMES:
        _HOMES[key] = checked(home_of, GRIDS, RUN_LISTINGS, *key)[1].config
    return _HOMES[key]


# Run identity (see README, "Run identity"). Train and eval jobs do not take the grid file as
# an input: its mtime changes with every edit, and Snakemake would redo every run of the
# grid. A train job's identity is its run id (the hash of its model / train / data fields),
# so a finished run is never redone by a grid edit. An eval job's parameter is its run's
# eval settings: Snakemake's params trigger re-runs that eval alone when they change.
def job_settings(kind):
    """A job kind's own settings (mor.jobs.KINDS[kind].settings_of) as its rule's `params:`
    trigger: an edit of them re-runs that job alone. JSON with sorted keys, so equal
    settings give an equal string and nothing re-runs."""
    import json

    def inner(wildcards):
        return json.dumps(KINDS[kind].settings_of(run_config(wildcards, kind), MODE, dict(wildcards.items())), sort_keys=True)

    return inner


def job_resources(kind):
    """A job rule's ``resources:``: its kind (``job_kind``) and, with the Slurm launcher, the
    preset the launcher submits it with (the run's scale and ``KINDS[kind].preset``, or the
    top-level ``data`` entry), as Snakemake resources (mor.launch.resources): GPUs, tasks,
    CPUs, memory, time limit, and partition / account / QoS / constraint where the file sets
    them. So the dry run shows them, ``--resources gpu=N`` caps the GPUs in flight, and
    Snakemake's own Slurm executor would ask for the same. Local launcher: the kind only."""
    out = {"job_kind": kind}
    if PRESET_TABLE is None:
        return out
    from mor.launch.resources import INT_RESOURCES, STR_RESOURCES, preset_resources, run_resource

    key = KINDS[kind].preset
    if key == "data":  # one entry, no run: plain values. A file without it is fine until the
        # data job runs on Slurm (cluster mode: data.smk stops with the missing key there)
        entry = PRESET_TABLE.data_entry
        return {**out, **preset_resources(entry)} if entry is not None else out
    every = [PRESET_TABLE.data_entry, *PRESET_TABLE.entries.values()]
    names = list(INT_RESOURCES) + [n for n in STR_RESOURCES if any(p and n in preset_resources(p) for p in every)]

    def one(name):  # runtime: the job's own limit from its estimate (mor.launch.resources.run_resource)
        return lambda wildcards: run_resource(PRESET_TABLE, run_config(wildcards, kind), kind, name,
                                              dict(wildcards.items()).get("analysis", ""), MODE)

    out.update({name: one(name) for name in names})
    if kind == "train":  # the plan's micro-batch and GiB per GPU, shown beside the request
        from mor.launch.resources import MEMORY_RESOURCES, train_memory

        memory = {}  # run id -> both values: one memory model per job, not per resource

        def planned(name):
            def inner(wildcards):
                k = wildcards.run_id
                if k not in memory:
                    memory[k] = train_memory(PRESET_TABLE, run_config(wildcards))
                return memory[k][name]

            return inner

        out.update({name: planned(name) for name in MEMORY_RESOURCES})
    return out


def lm_eval_task_inputs(wildcards):
    """The converted offline tasks, when a run scores any of them (mor_*)."""
    if any(is_local_task(t) for t in run_config(wildcards, "lmeval").eval.lm_eval_tasks):
        return [f"{DATA}/lm_eval/tasks/manifest.json"]
    return []


def lm_eval_result(wildcards):
    """An eval with lm-eval tasks: its measurement waits for (and reads) the lmeval job's JSON."""
    if run_config(wildcards, "eval").eval.lm_eval_tasks:
        return [str(layout.RunPaths.own(wildcards.run_id).lm_eval)]
    return []


def throughput_result(wildcards):
    """A run of a grid that draws fig4a, or that imports the authors' checkpoint (issue 62; the one
    rule: mor.throughput_protocol.measured): its row in that grid waits for (and reads) the throughput job's JSON."""
    from mor.throughput_protocol import measured

    if measured(grid_named(wildcards.grid).artifacts, run_config(wildcards)):
        return [str(layout.RunPaths(wildcards.grid, wildcards.run_id).throughput)]
    return []


def eval_measurement(wildcards):
    """A grid's row of a run reads the run's eval measurement under the eval settings that grid
    lists it with (runs/<run_id>/eval/<eval_hash>.parquet): grids that agree share one eval job."""
    return str(layout.RunPaths.own(wildcards.run_id).measurement(run_config(wildcards).eval_hash))


def rule_inputs(**parts):
    """One input function for a rule, from named ones (``input: unpack(rule_inputs(data=...,
    init=...))``): Snakemake inspects and calls every input function of every job on its own,
    so at thousands of jobs one function per rule costs less than one per input."""

    def inner(wildcards):
        return {name: fn(wildcards) for name, fn in parts.items()}

    return inner


def run_data_inputs(wildcards):
    """Token files (and a local tokenizer) that a run reads."""
    paths = data_paths(run_config(wildcards).data, DATA)
    files = [str(paths.train_tokens), str(paths.val_tokens)]
    if paths.tokenizer.endswith(".json"):
        files.append(paths.tokenizer)
    return files


def init_checkpoint_inputs(wildcards):
    """An up-training run waits for the run whose final weights it starts from."""
    ckpt = Path(run_config(wildcards).model.init_checkpoint)
    if ckpt.parts[:1] == (layout.RUNS,) and ckpt.name == layout.FINAL_DIR:
        return [str(layout.RunPaths.of(ckpt.parent).summary)]
    return []


def branch_source_inputs(wildcards):
    """A decay branch (mor.branching) waits for its warmup-stable run, which keeps the branch's
    starting checkpoint (checkpoints/branch/step-*) on the way to its own end."""
    stable = run_config(wildcards).train.branch_run
    return [str(layout.RunPaths.own(stable).summary)] if stable else []


_MODE_CHECKED = set()


def forced():
    """What this invocation forces (--forcerun, -F, -f; known once the DAG is built, not at parse)."""
    dag = workflow.dag_settings
    return {"collect"} if dag.forceall or dag.forcetargets else {str(f) for f in dag.forcerun}


def grid_outputs_of_this_mode(grid):
    """A grid's merged results, where present, hold this mode's runs: a local run's
    results/<grid>.parquet (and the tables and figures drawn from it) is never merged over or
    drawn over by the cluster profile, nor the reverse (one line naming the mode and what to move)."""
    path = Path(layout.GRID_RESULTS_PATTERN.format(grid=grid))
    if grid not in _MODE_CHECKED and path.exists():
        drawn = [a for a in [*grid_named(grid).artifacts, f"figures/curves/{grid}"] if Path(a).exists()]
        checked(check_mode, path, MODE, also=tuple(drawn))
    _MODE_CHECKED.add(grid)


def grid_rows(grid):
    """The result rows of exactly the runs a grid lists under the tags in force."""
    grid_outputs_of_this_mode(grid)
    return [str(layout.RunPaths(grid, r.run_id).row) for r in grid_named(grid).select(TAGS)]


def grid_run_results(wildcards):
    return grid_rows(wildcards.grid)


def artifact_grid(kind, wildcards):
    artifact = f"{kind}/{wildcards.name}"
    if artifact not in ARTIFACT_GRID:
        stop(LookupError(f"{artifact}: no grid in {GRIDS_DIR} lists it under artifacts; known: {ALL_ARTIFACTS}"))
    return ARTIFACT_GRID[artifact]


def artifact_results(kind):
    """A table's or figure's inputs: its grid's merged results, and the rows of each run the grid
    lists. The rows make the DAG itself follow the grid's run list: a run added to the grid is a
    missing row, so its train / lmeval / eval jobs (and the merge) are planned whenever the
    artifact is redrawn, whatever Snakemake's metadata holds (a copied results folder, no
    .snakemake, --rerun-triggers mtime). mor.cli report then checks the merge against the grid."""

    def inner(wildcards):
        grid = artifact_grid(kind, wildcards)
        rows = grid_rows(grid)
        checked(check_not_left_stale, f"{kind}/{wildcards.name}", grid, rows)
        return {"results": layout.GRID_RESULTS_PATTERN.format(grid=grid), "rows": rows}

    return inner


def check_not_left_stale(artifact, grid, rows):
    """The one case the inputs cannot catch: a drawn artifact newer than everything it reads
    (results copied after the grid was edited, a `tags` change without Snakemake's metadata),
    whose merged results are not the grid's run list. Snakemake would call it up to date; this
    stops with the runs missing or extra and the command that rebuilds it."""
    from mor.results import ResultsError, parquet_identity

    merged, drawn = Path(layout.GRID_RESULTS_PATTERN.format(grid=grid)), Path(artifact)
    drawer = {"tables": "table", "figures": "figure"}[artifact.split("/")[0]]
    if not (merged.exists() and drawn.exists()) or forced() & {"collect", drawer, str(merged), artifact}:
        return
    want = {Path(r).stem for r in rows}
    have = set(parquet_identity(merged)[0])
    if want == have:
        return
    t = drawn.stat().st_mtime
    newer = [p for p in [grid_named(grid).path, merged] if p.stat().st_mtime > t]
    newer += [r for r in rows if Path(r).exists() and Path(r).stat().st_mtime > merged.stat().st_mtime]
    if newer:  # Snakemake redraws it (mtime): mor.cli report checks the merge then
        return
    missing, extra = sorted(want - have), sorted(have - want)
    raise ResultsError(
        f"{artifact}: drawn from {merged}, which is not the runs grid {grid} lists now (mode {MODE}, "
        + (f"tags {TAGS}" if TAGS else "all tags") + "): "
        + "; ".join(filter(None, [f"missing {len(missing)}: {', '.join(missing[:4])}" if missing else "",
                                  f"extra {len(extra)}: {', '.join(extra[:4])}" if extra else ""]))
        + f"; and nothing Snakemake can see is newer than it. Rebuild it: snakemake {artifact} --forcerun collect "
        "(same --profile and --config), which trains what is missing")


def artifact_run_list(kind):
    """The rule's `params` trigger: the hash of the run list it is drawn from (a tags change redraws it)."""

    def inner(wildcards):
        grid = artifact_grid(kind, wildcards)
        return run_list_hash([r.run_id for r in grid_named(grid).select(TAGS)])

    return inner


def artifact_analyses(kind):
    """What an artifact draws besides its parquet: the analysis files (workflows/rules/analysis.smk),
    one per run it applies to, and the runs' tokenizer where it decodes tokens."""

    def inner(wildcards):
        from mor.analysis.sidecar import ARTIFACT_ANALYSES, TOKENIZER_ARTIFACTS, applies

        artifact = f"{kind}/{wildcards.name}"
        if artifact not in ARTIFACT_GRID:
            return []
        runs = GRIDS[ARTIFACT_GRID[artifact]].select(TAGS)
        files = []
        analysis = ARTIFACT_ANALYSES.get(artifact)
        if analysis is not None:
            files += [str(layout.RunPaths.own(r.run_id).sidecar(analysis)) for r in runs
                      if applies(analysis, r.config)]
        if artifact in TOKENIZER_ARTIFACTS:
            tokenizers = {data_paths(r.config.data, DATA).tokenizer for r in runs}
            files += sorted(t for t in tokenizers if t.endswith(".json"))
        return files

    return inner


def artifact_grid_file(kind):
    def inner(wildcards):
        return grid_file(ARTIFACT_GRID[f"{kind}/{wildcards.name}"])

    return inner


def hub_name(wildcards):
    """'HuggingFaceTB--SmolLM-135M' (a path-safe slug) -> 'HuggingFaceTB/SmolLM-135M'."""
    return wildcards.slug.replace("--", "/")


# The hub cache (workflows/rules/hub.smk): what the grids need from the Hugging Face hub.
HUB_TOKENIZERS = sorted({r.config.data.tokenizer for g in GRIDS.values() for r in g.select(TAGS)
                         if not local_tokenizer(r.config.data.tokenizer)})
HUB_TASKS = sorted({t for g in GRIDS.values() for r in g.select(TAGS) for t in r.config.eval.lm_eval_tasks
                    if not is_local_task(t)})
HUB_MANIFEST = f"{DATA}/hub/manifest.json"


def hub_cache_inputs(wildcards):
    """Jobs that read the hub cache (the data job's tokenizer, an lmeval job's tokenizer and
    task datasets) wait for it, when the grids need anything from the hub."""
    return [HUB_MANIFEST] if HUB_TOKENIZERS or HUB_TASKS else []


# Training curves (workflows/rules/report.smk draws them): captions, which artifacts need them, report section.
def curves_caption(grid):
    """workflows/report/curves.rst: the caption of a grid's training curves."""
    from mor.reports.curves import caption

    return caption(grid)


def artifact_curves(kind):
    """The training curves of an artifact's grid (rule curves), built with each of its artifacts."""

    def inner(wildcards):
        grid = ARTIFACT_GRID.get(f"{kind}/{wildcards.name}")
        return [f"figures/curves/{grid}"] if grid else []

    return inner


def artifact_section(kind):
    """The report category of a table or figure (rules table, figure): its paper section."""
    from mor.reports.captions import section

    def inner(wildcards):
        return section(f"{kind}/{wildcards.name}")

    return inner


# The claims' adaptive design (workflows/rules/claims.smk): which runs each round of seeds reads.
CLAIM_GRIDS = sorted({g for c in CLAIMS for g in c.grids if g in GRIDS})
# Its pre-registered design: the grids folder's own claims/claims.yaml where it has one (the
# shipped grids/ does), else the shipped file.
CLAIMS_SPEC = spec_for(GRIDS_DIR)


def round_seeds(r):
    """grid -> block -> seeds, as the rounds before round r asked for ({} in round 0)."""
    if r == 0:
        return {}
    return json.loads(Path(checkpoints.seeding.get(round=r - 1).output[0]).read_text())["seeds"]


# The design's first fresh seed: a raised block skips the pilot's seeds below it (mor.claims.rounds.round_grid).
FIRST_SEED = checked(load_specs, CLAIMS_SPEC, mode=MODE)[0].first_seed


def round_runs(grid, r):
    seeds = round_seeds(r).get(grid)
    return (round_grid(GRIDS[grid].path, MODE, seeds, FIRST_SEED) if seeds else GRIDS[grid]).select(TAGS)


def round_inputs(r):
    """What round r's verdicts read: each claim grid's results, fig5c's depth-cap files, and
    the round before's plan."""
    from mor.analysis.sidecar import applies

    files = [f"results/claims/round{r}/{g}.parquet" for g in CLAIM_GRIDS]
    if "fig5c" in GRIDS:
        files += [str(layout.RunPaths.own(run.run_id).sidecar("depth_cap")) for run in round_runs("fig5c", r)
                  if applies("depth_cap", run.config)]
    if r:
        files.append(f"results/claims/round{r - 1}/plan.json")
    return files


def final_round():
    """The first round whose plan stops the design (evaluating it runs the rounds before)."""
    r = 0
    while not json.loads(Path(checkpoints.seeding.get(round=r).output[0]).read_text())["stop"]:
        r += 1
        if r > 100:  # each round raises a block to a higher look, so this means a broken plan.json
            raise ValueError(f"results/claims: over 100 rounds of the adaptive design; see results/claims/round{r}/plan.json")
    return r


# The claims rules' input and params functions (workflows/rules/claims.smk), named rather than lambdas.
def round_plan(k):
    return f"results/claims/round{k}/plan.json"


def round_run_results(wildcards):
    """Rule collect_round: the result rows of the runs round ``round`` of ``grid`` reads."""
    return [str(layout.RunPaths(wildcards.grid, run.run_id).row)
            for run in round_runs(wildcards.grid, int(wildcards.round))]


def this_round_inputs(wildcards):
    return round_inputs(int(wildcards.round))


def previous_plan_arg(wildcards):
    r = int(wildcards.round)
    return f"--previous {round_plan(r - 1)}" if r else ""


def final_round_inputs(wildcards):
    return round_inputs(final_round()) + [round_plan(k) for k in range(final_round() + 1)]


def round_plan_args(wildcards):
    return " ".join(f"--round {round_plan(k)}" for k in range(final_round() + 1))


def final_round_param(wildcards):
    return final_round()
