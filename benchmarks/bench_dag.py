"""How the workflow's dry run grows with the runs of a grid, beside Snakemake's own speed.

For generated grids of 100, 500, 1,000 and 2,000 runs (``generated_grid``: MoR at the local
mode's CPU scale, 4 recursion settings x learning rates x 5 seeds, the shape of a first
ablation), it times ``snakemake -n`` of the grid's results (train, lmeval, eval per run, the
data rules, collect) and of a bare Snakefile with as many trivial jobs in the same chains
(Snakemake's own speed: the anchor), and prints for each:

    wall s, peak MiB     of the dry run (its process's max RSS), project and bare
    project / bare       the ratio the target bounds (<= 2x)
    project share        the time spent in this project's code (the Snakefile's and the rule
                         files' own code, the grid expansion, every input / params /
                         resources function, and the libraries they call), measured by
                         sampling the stack every millisecond in a second dry run (SAMPLER),
                         as a fraction applied to the unsampled wall time; per run in ms
                         (target <= 10 ms)
    Snakemake share      the rest
    s / run              wall seconds per run

It also times ``python -m mor.launch plan`` over every shipped grid (its wall time, and the
interpreter's own start for comparison). Nothing is trained; it writes only under a
temporary folder (and --out).

    .venv/bin/python benchmarks/bench_dag.py                      # all four sizes, ~5-10 min here
    .venv/bin/python benchmarks/bench_dag.py --runs 100 --out /tmp/dag.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (100, 500, 1000, 2000)
SEEDS = 5
RECURSIONS = ({"model.num_recursions": 2, "model.tying": "cycle"}, {"model.num_recursions": 2, "model.tying": "middle_cycle"},
              {"model.num_recursions": 3, "model.tying": "cycle"}, {"model.num_recursions": 3, "model.tying": "middle_cycle"})


def generated_grid(name: str, runs: int, seeds: int = SEEDS, settings: int = len(RECURSIONS)) -> str:
    """A grid file of exactly ``runs`` runs: one MoR block per recursion setting (the first
    ``settings`` of RECURSIONS), each with an axis of ``runs / (settings x seeds)`` learning
    rates, at ``seeds`` seeds; a local (CPU scale) and a cluster (paper scale) mode."""
    per = settings * seeds
    if runs % per:
        raise ValueError(f"runs={runs} is not a multiple of {per} ({settings} recursion settings x {seeds} seeds)")
    lrs = [round(1e-3 + i * 1e-5, 8) for i in range(runs // per)]
    modes = (f"  local: {{base: cpu-local, scale_map: {{135M: small}}, seeds: {seeds}}}\n"
             f"  cluster: {{base: paper-10B, scale_map: {{135M: 135M}}, seeds: {seeds}}}\n")
    blocks = []
    for i, r in enumerate(RECURSIONS[:settings]):
        sets = ", ".join(f"{k}: {v}" for k, v in r.items())
        blocks.append(f"  - name: mor{i}\n    set: {{model.variant: mor, {sets}}}\n"
                      f"    axes:\n      model.scale: [135M]\n      train.lr: {json.dumps(lrs)}\n")
    return (f"name: {name}\ndescription: generated grid of {runs} runs (benchmarks/bench_dag.py)\nartifacts: []\n"
            "defaults:\n  model: {router: {type: expert_choice, func: sigmoid, alpha: 0.1}}\n"
            "runs:\n" + "".join(blocks) + "modes:\n" + modes + "reference: []\n")


def bare_snakefile(runs: int, chain: int) -> str:
    """``runs`` x ``chain`` trivial jobs (each run a chain of wildcard rules, like train ->
    lmeval -> eval) and one job that collects the chains' ends, with input functions."""
    rules = [f"RUNS = [f'r{{i:05d}}' for i in range({runs})]\n",
             "rule all:\n    input: 'collect.txt'\n",
             "rule collect:\n    input: lambda w: [f'out/{r}/step{CHAIN}.txt' for r in RUNS]\n"
             "    output: 'collect.txt'\n    shell: 'touch {output}'\n".replace("{CHAIN}", str(chain - 1))]
    for k in range(chain):
        inp = f"    input: lambda w: [f'out/{{w.run}}/step{k - 1}.txt']\n" if k else ""
        rules.append(f"rule step{k}:\n{inp}    output: 'out/{{run}}/step{k}.txt'\n"
                     f"    params: x=lambda w: w.run\n    shell: 'touch {{output}}'\n")
    return "\n".join(rules)


def _run_measured(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and output of one command, run under a fresh wrapper
    process so that the peak (ru_maxrss of the wrapper's children) is this command's own."""
    wrapper = ("import resource, subprocess, sys, time, json\n"
               "t = time.perf_counter(); p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, "
               "stderr=subprocess.STDOUT, text=True)\n"
               "w = time.perf_counter() - t\n"
               "sys.stdout.write(p.stdout)\n"
               "print('\\n@@BENCH ' + json.dumps([w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, "
               "p.returncode]))\n")
    p = subprocess.run([sys.executable, "-c", wrapper, *cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    out, _, tail = p.stdout.rpartition("\n@@BENCH ")
    wall, rss, rc = json.loads(tail)
    if rc:
        raise RuntimeError(f"{' '.join(cmd)} failed ({rc}):\n{out[-3000:]}")
    return wall, rss, out


# Run Snakemake in this process with a thread that samples the main thread's stack every
# millisecond. A sample belongs to the project when, walking from the innermost frame out, the
# first frame that is the project's or Snakemake's is the project's: time in a library the
# project calls (yaml, jsonschema, json, hashlib) is the project's, time in Snakemake's
# machinery that the project's code calls (``include:``, a rule's decorators) is Snakemake's.
SAMPLER = """
import os, sys, threading, time, json
roots = tuple(json.loads(os.environ["BENCH_PROJECT_ROOTS"]))
mine = lambda f: f.startswith(roots)
theirs = lambda f: "/snakemake" in f and "site-packages" in f
counts = {"project": 0, "snakemake": 0, "other": 0}
main_id = threading.main_thread().ident
done = threading.Event()
def sample():
    while not done.is_set():
        frame = sys._current_frames().get(main_id)
        who = "other"
        while frame is not None:
            f = frame.f_code.co_filename
            if mine(f):
                who = "project"; break
            if theirs(f):
                who = "snakemake"; break
            frame = frame.f_back
        counts[who] += 1
        time.sleep(0.001)
sys.setswitchinterval(0.0005)
t = threading.Thread(target=sample, daemon=True); t.start()
from snakemake.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
else:
    code = 0
done.set(); t.join()
print("\\n@@SAMPLES " + json.dumps(counts), flush=True)
sys.exit(code or 0)
"""


def project_share(out: str) -> float:
    """The project's fraction of the samples of a sampled dry run (SAMPLER's output)."""
    counts = json.loads(out.rpartition("@@SAMPLES ")[2].splitlines()[0])
    total = sum(counts.values())
    return counts["project"] / total if total else 0.0


def jobs_of(out: str) -> int:
    """The total of Snakemake's dry-run job table."""
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total" and parts[1].isdigit():
            return int(parts[1])
    raise ValueError("no job total in the dry run's output:\n" + out[-2000:])


def bench_size(runs: int, work: Path, env: dict, profile: bool = True) -> dict:
    grids = work / f"grids{runs}"
    grids.mkdir(parents=True, exist_ok=True)
    name = f"gen{runs}"
    (grids / f"{name}.yaml").write_text(generated_grid(name, runs))
    wd = work / f"wd{runs}"
    wd.mkdir(exist_ok=True)
    base = [str(Path(sys.executable).with_name("snakemake")), "-n", "--profile", str(REPO / "local"),
            "--snakefile", str(REPO / "Snakefile"), "--directory", str(wd), "--nolock",
            "--config", f"grids_dir={grids}", f"data_root={wd / 'data'}"]
    target = ["--", f"results/{name}.parquet"]
    wall, rss, out = _run_measured(base + target, REPO, env)
    jobs = jobs_of(out)
    chain = max(1, round((jobs - 1) / runs))
    bare = work / f"bare{runs}"
    bare.mkdir(exist_ok=True)
    (bare / "Snakefile").write_text(bare_snakefile(runs, chain))
    bwall, brss, bout = _run_measured([str(Path(sys.executable).with_name("snakemake")), "-n", "--cores", "1",
                                       "--nolock", "--snakefile", str(bare / "Snakefile"), "--directory",
                                       str(bare)], bare, env)
    row = {"runs": runs, "jobs": jobs, "wall_s": wall, "peak_mib": rss, "bare_jobs": jobs_of(bout),
           "bare_wall_s": bwall, "bare_peak_mib": brss, "ratio": wall / bwall, "s_per_run": wall / runs}
    if profile:
        env = {**env, "BENCH_PROJECT_ROOTS": json.dumps([str(REPO / "src" / "mor"), str(REPO / "workflows"),
                                                         str(REPO / "Snakefile")])}
        _, _, sampled = _run_measured([sys.executable, "-c", SAMPLER, *base[1:], *target], REPO, env)
        frac = project_share(sampled)
        row.update(project_fraction=frac, project_s=frac * wall, snakemake_s=(1 - frac) * wall,
                   project_ms_per_run=1000 * frac * wall / runs)
    return row


def bench_plan(env: dict) -> dict:
    grids = sorted(str(p) for p in (REPO / "grids").glob("*.yaml") if p.name != "scales.yaml")
    tracked = subprocess.run(["git", "ls-files", "grids/*.yaml"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout.strip():  # the committed grids (not a half-written new one)
        grids = [g for g in grids if Path(g).relative_to(REPO).as_posix() in tracked.stdout.split()]
    from mor.grids import load_grid
    from mor.launch.cost import plan_grid
    from mor.launch.presets import PresetError, load_presets

    skipped = []
    for g in list(grids):  # a grid the shipped presets cannot price stops the plan: left out, and named
        try:
            plan_grid(load_grid(g, "cluster"), load_presets())
        except PresetError as e:
            grids.remove(g)
            skipped.append(f"{Path(g).name}: {e}")
    args = [a for g in grids for a in ("--grid", g)]
    wall, rss, _ = _run_measured([sys.executable, "-m", "mor.launch", "plan", *args], REPO, env)
    start, _, _ = _run_measured([sys.executable, "-c", "pass"], REPO, env)
    return {"grids": len(grids), "skipped": skipped, "plan_wall_s": wall, "interpreter_s": start, "beyond_start_s": wall - start,
            "plan_peak_mib": rss}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--no-profile", action="store_true", help="skip the sampled dry runs (no project share)")
    ap.add_argument("--out", help="write the figures as JSON here")
    a = ap.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-dag-") as tmp:
        plan = bench_plan(env)
        print(f"mor.launch plan over {plan['grids']} grids: {plan['plan_wall_s']:.2f} s "
              f"({plan['beyond_start_s']:.2f} s beyond the interpreter's {plan['interpreter_s']:.2f} s start)",
              flush=True)
        for line in plan["skipped"]:
            print(f"  left out (the plan cannot price it): {line}", flush=True)
        print(f"{'runs':>5} {'jobs':>6} {'wall s':>7} {'MiB':>5} {'bare s':>7} {'MiB':>5} {'ratio':>5} "
              f"{'project s':>9} {'ms/run':>6} {'snakemake s':>11} {'s/run':>6}", flush=True)
        for n in a.runs:
            r = bench_size(n, Path(tmp), env, profile=not a.no_profile)
            rows.append(r)
            proj = (f"{r['project_s']:>9.2f} {r['project_ms_per_run']:>6.2f} {r['snakemake_s']:>11.2f}"
                    if "project_s" in r else f"{'-':>9} {'-':>6} {'-':>11}")
            print(f"{n:>5} {r['jobs']:>6} {r['wall_s']:>7.2f} {r['peak_mib']:>5.0f} {r['bare_wall_s']:>7.2f} "
                  f"{r['bare_peak_mib']:>5.0f} {r['ratio']:>5.2f} {proj} {r['s_per_run']:>6.3f}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"plan": plan, "dag": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
