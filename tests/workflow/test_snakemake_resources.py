"""Snakemake sees each job's Slurm resources (issue 29): the dry run of ``--profile slurm``
prints, for every train / eval / lmeval / analysis / throughput job, the GPUs, tasks, nodes,
time limit and memory that ``mor.launch plan`` plans for the same job from the same preset
file (for train jobs also the plan's micro-batch and modelled GiB per GPU), and nothing for a
job the plan does not have (or the other way round)."""

from __future__ import annotations

import os
import re
import sys

import pytest

from helpers.paths import REPO
from mor.layout import by_grid
from mor.grids import all_grids, load_grid
from mor.jobs import KINDS
from mor.launch.cost import plan_grid
from mor.launch.resources import preset_resources, resource
from mor.launch.presets import PresetError, load_presets

RULE_KIND = {"train": "train", "eval": "eval", "lmeval": "lmeval", "analysis": "analysis", "throughput": "throughput"}


def dry_run_jobs(text: str) -> list[dict]:
    """Every job block of a dry run: its rule, wildcards and resources (as strings)."""
    jobs = []
    for block in re.split(r"\n(?=rule \w+:\n)", text):
        m = re.match(r"rule (\w+):\n", block)
        if not m:
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, re.M))
        pairs = lambda s: dict(p.split("=", 1) for p in s.split(", ") if "=" in p)  # noqa: E731
        jobs.append({"rule": m.group(1), "wildcards": pairs(fields.get("wildcards", "")),
                     "resources": pairs(fields.get("resources", ""))})
    return jobs


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    from helpers.procs import run_group

    wd = tmp_path_factory.mktemp("slurm-dry")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    env.pop("MOR_SITE", None)
    proc = run_group([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--profile",
                      str(REPO / "slurm"), "-n", "--nolock", "--directory", str(wd), "--config",
                      f"grids_dir={REPO / 'grids'}", f"data_root={wd / 'data'}", "--", "all"], cwd=REPO, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def test_every_job_shows_the_resources_the_plan_prints(dry_run):
    presets = load_presets()
    dry = {}
    for job in dry_run_jobs(dry_run):
        if job["rule"] not in RULE_KIND:
            continue
        w = job["wildcards"]  # a run's own jobs are keyed by run id (one home, issue 58), an eval also by its eval hash
        dry[(w.get("grid", ""), RULE_KIND[job["rule"]], w["run_id"], w.get("analysis", ""), w.get("eval_hash", ""))] = \
            job["resources"]
    planned, unpriced = {}, set()
    for path in all_grids():
        grid = load_grid(path, "cluster")
        scale = {r.run_id: r.config.model.scale for r in grid.runs}
        eval_hash = {r.run_id: r.config.eval_hash for r in grid.runs}
        try:
            jobs = plan_grid(grid, presets)
        except PresetError:  # a scale the preset file lacks: the plan stops, the dry run asks for nothing
            unpriced |= {(grid.name, r.run_id) for r in grid.runs}
            continue
        for j in jobs:  # a shared run's job once (an eval once per eval settings), as the first grid that lists it plans it
            key = (grid.name if by_grid(j.kind) else "", j.kind, j.run_id, j.analysis,
                   eval_hash[j.run_id] if j.kind == "eval" else "")
            planned.setdefault(key, (j, scale[j.run_id]))
    for key in [k for k in dry if k not in planned and any(k[2] == rid and k[0] in (g, "") for g, rid in unpriced)]:
        assert int(dry.pop(key)["gpu"]) == 0, key
    assert set(dry) == set(planned)  # the same jobs
    assert {k[1] for k in dry} == set(RULE_KIND.values())  # every job kind is there
    for key, res in dry.items():
        j, scale = planned[key]
        assert res["job_kind"] == j.kind, key
        if j.missing_preset:  # the plan warns NO PRESET; the workflow asks for nothing
            assert int(res["gpu"]) == 0 and int(res["runtime"]) == 0, key
            continue
        got = {k: int(res[k]) for k in ("gpu", "nodes", "tasks", "runtime", "node_mem_mib", "cpus_per_task")}
        preset = presets.get(scale, KINDS[j.kind].preset)
        assert got == {"gpu": j.gpus, "nodes": j.nodes, "tasks": j.world_size, "runtime": j.time_min,
                       "node_mem_mib": round(preset.mem_gb * 1024), "cpus_per_task": preset.cpus_per_task}, key
        # memory once, in one unit: no mem_mb that Snakemake would print again as mem= and mem_mib=
        assert not {"mem_mb", "mem", "mem_mib"} & set(res), key
        if j.kind == "train":  # the plan's micro and GiB/GPU columns
            assert int(res["planned_micro_batch"]) == j.micro_batch, key
            assert int(res["planned_gpu_mem_mib"]) == round(j.memory_gib * 1024), key
        else:
            assert "planned_gpu_mem_mib" not in res, key
    # the example: a 135M train job of table10 asks for 1 x 2 GPUs for its estimate x 1.5
    # (Cycle Nr 2: 14.25 h at the a100-80gb site, 21:30), not the preset's 24:00 for every one
    # (mor.launch.cost.time_limit_min; the reduced Vanillas, shallower, ask for less)
    table10 = {r.run_id for r in load_grid(REPO / "grids" / "table10.yaml", "cluster").runs}
    train135 = {rid: r for (g, k, rid, _, _), r in dry.items() if rid in table10 and k == "train" and rid.startswith("135M-")}
    assert train135 and all((r["nodes"], r["gpu"]) == ("1", "2") and int(r["runtime"]) < 1440 for r in train135.values())
    assert [r["runtime"] for rid, r in train135.items() if rid.startswith("135M-recursive-cycle-nr2-")] == ["1290"]
    assert all(40_000 < int(r["planned_gpu_mem_mib"]) < 80 * 1024 for r in train135.values())  # fits the A100's 80 GiB


def test_the_data_job_names_its_preset(dry_run):
    """The fineweb rule prints a message instead of its block: it names the data preset."""
    data = load_presets().data
    line = next(ln for ln in dry_run.splitlines() if "rule fineweb" in ln)
    assert f"{data.cpus_per_task} CPUs, 0 GPUs, {data.mem_gb:g} GB, {data.time_min // 60}:{data.time_min % 60:02d} h" in line


def test_preset_resources_follow_the_preset(tmp_path):
    """Partition, account, QoS and constraint appear where the file sets them; a kind without
    an entry at a scale gets no resources (the launcher fails it, the plan warns)."""
    f = tmp_path / "p.yaml"
    f.write_text("defaults: {partition: gpu, account: lab, qos: null}\nscales:\n"
                 "  tiny: {train: {nodes: 2, gpus_per_node: 4, cpus_per_task: 6, mem_gb: 1.5, time_min: 90}}\n"
                 "data: {gpus_per_node: 0, cpus_per_task: 3, mem_gb: 4, time_min: 60}\n")
    p = load_presets(f, site=None)
    got = preset_resources(p.get("tiny", "train"))
    assert got == {"nodes": 2, "tasks": 8, "gpu": 8, "cpus_per_task": 6, "node_mem_mib": 1536, "runtime": 90,
                   "slurm_partition": "gpu", "slurm_account": "lab"}
    assert resource(p, "tiny", "eval", "gpu") == 0 and resource(p, "tiny", "eval", "slurm_partition") is None
    assert resource(p, "", "data", "cpus_per_task") == 3 and resource(p, "", "data", "gpu") == 0
