"""mor.launch without Slurm: presets, the plan's numbers, rank discovery, the pickled callables,
the inline launcher, and FSDP (2 gloo ranks) against a single-process run of the same batches.

The real-Slurm behaviour (profile, DDP job, requeue, failure) is in cluster/test_slurm_workflow.py.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import subprocess
import sys
from contextlib import redirect_stdout
from dataclasses import replace

import pytest
import torch

from helpers.deadlines import deadline
from helpers.launch import _FakeEnv, _free_port, single_process_reference
from helpers.paths import REPO
from helpers.tiny import VOCAB, tiny_grid_file, tiny_run
from mor.config import RouterConfig, load_scales
from mor.flops import train_flops
from mor.grids import load_grid
from mor.launch import distributed
from mor.launch.__main__ import main as launch_main
from mor.launch.checkpointable import Job
from mor.launch.cost import estimate, plan_grid
from mor.launch.presets import DEFAULT_PRESETS, Preset, PresetError, load_presets
from mor.train.parallel import trainer_class
from mor.train.trainer import DistInfo

PAPER_SCALES = ("135M", "360M", "730M", "1.7B")


# ------------------------------------------------------------------ a reference for data parallelism


# ------------------------------------------------------------------ presets
def test_shipped_presets_cover_every_paper_scale_and_job_kind():
    presets = load_presets(DEFAULT_PRESETS)
    for scale in PAPER_SCALES:
        train = presets.get(scale, "train")
        assert 1 <= train.gpus <= 4 and train.world_size == train.gpus, (scale, train)
        assert train.time_min * 60 > train.signal_delay_s
        for kind in ("eval", "throughput"):
            assert presets.get(scale, kind).world_size == 1
    assert presets.get("1.7B", "train").parallel == "fsdp"
    assert presets.get("135M", "train").parallel == "ddp"
    cpu = presets.get("tiny", "train")
    assert cpu.gpus_per_node == 0 and cpu.world_size == 1
    for scale in ("micro", "xxs", "xs", "small", "medium", "135M-smollm2"):  # the local stand-ins: measured prices
        for kind in ("train", "eval", "lmeval", "throughput"):
            p = presets.get(scale, kind)
            assert p.gpus == 0 and p.world_size == 1 and p.start_s > 0 and p.tflops_per_gpu != cpu.tflops_per_gpu


BAD_PRESETS = [
    ("scales: {135M: {train: {gpus_per_node: two}}}",
     "scales.135M.train.gpus_per_node: expected an integer >= 0 and <= 64, got 'two'"),
    ("scales: {135M: {train: {gpu: 1}}}", "scales.135M.train: unknown key(s) ['gpu']"),
    ("scales: {999M: {train: {}}}", "scales.999M: unknown scale '999M'"),
    ("scales: {135M: {training: {}}}", "scales.135M: unknown job kind(s) ['training']"),
    ("scales: {135M: {eval: {gpus_per_node: 2}}}", "scales.135M.eval: a eval job runs one process"),
    ("scales: {135M: {train: {parallel: zero}}}", "scales.135M.train.parallel: 'zero' is not allowed"),
    ("defaults: {time_min: 0}\nscales: {135M: {train: {}}}", "defaults.time_min: expected an integer >= 1"),
    ("scales: {135M: {train: {gpus_per_node: 4, tasks_per_node: 2}}}",
     "scales.135M.train.tasks_per_node: 2 != gpus_per_node=4"),
    ("scales: {135M: {train: {time_min: 1, signal_delay_s: 90}}}", "scales.135M.train.signal_delay_s"),
    ("scales: {135M: {train: {sbatch: [exclusive]}}}", "scales.135M.train.sbatch: expected a mapping"),
    ("partitions: {}\nscales: {135M: {train: {}}}", "unknown top-level key(s) ['partitions']"),
    ("scales: [135M]", "key scales: expected a mapping"),
]


@pytest.mark.parametrize("text, message", BAD_PRESETS)
def test_bad_presets_fail_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(PresetError) as err:
        load_presets(path)
    assert str(err.value).startswith(f"{path}: "), str(err.value)
    assert message in str(err.value)


# every number a preset entry can hold, each given values no site means: NaN, infinities, null,
# empty text, a boolean, a number far out of range, and (for the strictly positive ones) zero
NUMERIC_KEYS = ("nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "mem_gb", "time_min", "signal_delay_s",
                "max_timeouts", "tflops_per_gpu", "peak_tflops_per_gpu", "tokens_per_s_per_cpu", "gpu_memory_gib",
                "start_s")
NOT_NUMBERS = (".nan", ".inf", "-.inf", "null", "''", "true", "1.0e+30", "'nan'", "'inf'")
POSITIVE_KEYS = ("nodes", "cpus_per_task", "mem_gb", "time_min", "tflops_per_gpu", "tokens_per_s_per_cpu")


def _bad_entries():
    for key in NUMERIC_KEYS:
        for value in NOT_NUMBERS + (("0",) if key in POSITIVE_KEYS else ()):
            for where in ("scales.135M.train", "defaults", "data"):
                yield key, value, where


def _preset_text(where: str, key: str, value: str) -> str:
    entry = f"{{{key}: {value}}}"
    if where == "defaults":
        return f"defaults: {entry}\nscales: {{135M: {{train: {{gpus_per_node: 1}}}}}}"
    if where == "data":
        return f"data: {entry}\nscales: {{135M: {{train: {{gpus_per_node: 1}}}}}}"
    return f"scales: {{135M: {{train: {entry}}}}}"


BAD_ENTRIES = list(_bad_entries())


def test_every_number_of_a_preset_is_finite_and_in_range(tmp_path, monkeypatch):
    """Each of the %d (key, value, place) combinations is refused with an error that starts
    with the file and names the place and the key; none gives a preset (a NaN or inf once
    passed, since ``x <= 0`` is false for NaN)."""
    monkeypatch.delenv("MOR_SITE", raising=False)
    path = tmp_path / "bad.yaml"
    accepted = []
    for key, value, where in BAD_ENTRIES:
        path.write_text(_preset_text(where, key, value))
        try:
            load_presets(path)
        except PresetError as e:
            msg = str(e)
            assert msg.startswith(f"{path}") and f"{where}.{key}" in msg, (key, value, where, msg)
        else:
            accepted.append((key, value, where))
    assert accepted == []
    assert len(BAD_ENTRIES) == 369  # counted in the report: 13 keys x 9 (+1 zero for 6) x 3 places


test_every_number_of_a_preset_is_finite_and_in_range.__doc__ %= len(BAD_ENTRIES)

SITE_OK = {"gpu": "H200", "gpu_memory_gib": 140.4, "gpus_per_node": 8, "peak_tflops_per_gpu": 989,
           "tflops_per_gpu": "{train: 420, eval: 200}", "throughput_source": "assumed until measured"}
BAD_SITES = [(k, v) for k in ("gpu_memory_gib", "peak_tflops_per_gpu", "gpus_per_node")
             for v in NOT_NUMBERS + ("0", "-1")] + \
            [("gpu", "null"), ("gpu", "''"), ("throughput_source", "null"), ("tflops_per_gpu", "{}"),
             ("tflops_per_gpu", "null"), ("tflops_per_gpu", "{train: .nan}"), ("tflops_per_gpu", "{train: .inf}"),
             ("tflops_per_gpu", "{train: 0}"), ("tflops_per_gpu", "{train: 2000}"), ("tflops_per_gpu", "{training: 1}")]


@pytest.mark.parametrize("key, value", BAD_SITES)
def test_bad_site_profiles_are_refused_naming_the_file_and_key(tmp_path, monkeypatch, key, value):
    """A site profile's numbers are finite and in range (a sustained rate above the GPU's peak
    is out of range), its names non-empty and its throughput mapping non-empty: the site with
    ``gpu_memory_gib: .nan`` once planned "nan GiB" and a false "22 train jobs do not fit",
    ``tflops_per_gpu: {}`` moved table10's estimate from 276 to 1,159 GPU-h."""
    from mor.launch.presets import load_site

    monkeypatch.delenv("MOR_SITE", raising=False)
    site = tmp_path / "mysite.yaml"
    site.write_text("".join(f"{k}: {value if k == key else v}\n" for k, v in SITE_OK.items()))
    with pytest.raises(PresetError) as err:
        load_site(site)
    assert str(err.value).startswith(f"{site}: {key}"), str(err.value)
    presets = tmp_path / "p.yaml"
    presets.write_text(f"site: {site}\nscales: {{135M: {{train: {{gpus_per_node: 1}}}}}}")
    with pytest.raises(PresetError, match=key):
        load_presets(presets)


def test_empty_entries_are_refused_and_an_empty_mapping_means_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("MOR_SITE", raising=False)
    path = tmp_path / "p.yaml"
    for text, where in (("scales: {135M: {train: null}}", "scales.135M.train: is empty"),
                        ("scales: {135M: {}}", "scales.135M: expected a non-empty mapping"),
                        ("scales: {135M: {train: {}}}\ndata: null", "data: is empty")):
        path.write_text(text)
        with pytest.raises(PresetError, match=where):
            load_presets(path)
    path.write_text("defaults: {mem_gb: 12}\nscales: {135M: {train: {}}}")
    assert load_presets(path).get("135M", "train").mem_gb == 12


def test_missing_preset_file_and_entry_are_named(tmp_path):
    with pytest.raises(PresetError, match="nope.yaml: preset file not found"):
        load_presets(tmp_path / "nope.yaml")
    path = tmp_path / "mine.yaml"
    path.write_text("scales: {135M: {train: {gpus_per_node: 1}}}")
    presets = load_presets(path)
    with pytest.raises(PresetError, match=r"mine.yaml: key scales.360M is missing.*\['135M'\]"):
        presets.get("360M", "train")
    with pytest.raises(PresetError, match=r"mine.yaml: key scales.135M.eval is missing; scale 135M has \['train'\]"):
        presets.get("135M", "eval")


def test_preset_to_submitit_parameters(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("defaults: {partition: gpu, account: proj1, sbatch: {exclusive: true, mail-type: FAIL}}\n"
                    "scales:\n  360M: {train: {nodes: 2, gpus_per_node: 4, cpus_per_task: 12, mem_gb: 400,"
                    " time_min: 720, qos: high}}\n  tiny: {train: {tasks_per_node: 2, mem_gb: 1.5}}\n")
    presets = load_presets(path)
    gpu = presets.get("360M", "train").submitit_parameters("job")
    assert gpu == {"name": "job", "timeout_min": 720, "nodes": 2, "tasks_per_node": 4, "cpus_per_task": 12,
                   "mem_gb": 400.0, "slurm_signal_delay_s": 120, "gpus_per_node": 4, "slurm_partition": "gpu",
                   "slurm_account": "proj1", "slurm_qos": "high",
                   "slurm_additional_parameters": {"exclusive": True, "mail-type": "FAIL"}}
    cpu = presets.get("tiny", "train")
    assert cpu.world_size == 2 and "gpus_per_node" not in cpu.submitit_parameters("j")  # no --gpus-per-node=0
    assert "slurm_constraint" not in gpu  # unset site fields are omitted, not sent empty


# ------------------------------------------------------------------ plan
def test_plan_counts_jobs_and_gpu_hours_of_table10():
    grid = load_grid(REPO / "grids" / "table10.yaml", "cluster")
    presets = load_presets(DEFAULT_PRESETS)
    jobs = plan_grid(grid, presets)
    kinds = [j.kind for j in jobs]
    # every run: train, eval and (paper-10B lists six lm-eval tasks) lmeval; table10 draws no fig4a
    # (no throughput job) and no figure that needs an analysis (tests/unit/test_plan.py: those kinds)
    assert {k: kinds.count(k) for k in set(kinds)} == {"train": 22, "eval": 22, "lmeval": 22}
    run = next(r.config for r in grid.runs if r.config.model.scale == "135M")
    job = next(j for j in jobs if j.run_id == run.run_id and j.kind == "train")
    flops = train_flops(run.model, load_scales()["135M"], 49152, 2048, run.train.steps * 1024 * 2048)
    assert job.flops == pytest.approx(flops) and 1e19 < flops < 2e19  # ~6N per token x 10B tokens, + attention
    hours = flops / (120e12 * 2) / 3600  # 2 GPUs at the preset's assumed 120 TFLOP/s each
    assert job.hours == pytest.approx(hours) and job.gpu_hours == pytest.approx(2 * hours)
    # one slot of 1.5 x the estimate (mor.launch.cost.TIME_MARGIN), rounded up to 15 min, x 2 GPUs
    limit = math.ceil(hours * 60 * 1.5 / 15) * 15
    assert limit < 24 * 60 and job.time_min == limit
    assert job.segments == 1 and job.gpu_hours_requested == pytest.approx(limit / 60 * 2)
    # a shorter time limit: the run is split into ceil(hours / limit) requeued segments
    short = estimate(run, "train", Preset(gpus_per_node=2, time_min=120, tflops_per_gpu=120))
    assert short.segments == math.ceil(hours / 2) and short.gpu_hours_requested == pytest.approx(short.segments * 4)


def test_plan_command_prints_jobs_gpu_hours_and_run_ids():
    out = io.StringIO()
    with redirect_stdout(out):
        assert launch_main(["plan", "--grid", str(REPO / "grids" / "table10.yaml"), "--mode", "cluster"]) == 0
    text = out.getvalue()
    grid = load_grid(REPO / "grids" / "table10.yaml", "cluster")
    assert "jobs: train 22, eval 22, lmeval 22" in text
    head = next(ln for ln in text.splitlines() if ln.startswith("  GPU-hours for tables/table10, figures/fig6, figures/fig4b:"))
    words = head.split(": ", 1)[1].split()  # "<est> estimated, <req> requested (train ..., ...)"
    est, req = float(words[0]), float(words[2])
    # the per-kind summary: one line per kind, summing to the grid's line
    rows = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines()
            if ln.startswith("    ") and ln.split()[0] in ("train", "eval", "lmeval")}
    assert set(rows) == {"train", "eval", "lmeval"} and all(r[0] == "22" for r in rows.values())
    assert sum(float(r[1]) for r in rows.values()) == pytest.approx(est, abs=0.15)
    # requested: each job's own limit (mor.launch.cost.time_limit_min), not the presets' 24 h per train job
    # (11 at 135M on 2 GPUs, 11 at 360M on 4), 3 h per eval, 1 h per lmeval: ~15 % less than those
    presets_only = 11 * 2 * 24 + 11 * 4 * 24 + 22 * 3 + 22 * 1
    assert sum(float(r[2]) for r in rows.values()) == pytest.approx(req) and 0.5 * presets_only < req < 0.9 * presets_only
    assert float(rows["eval"][2]) == pytest.approx(22 * 0.5) and float(rows["lmeval"][2]) == pytest.approx(22 * 0.5)
    assert all(r.run_id in text for r in grid.runs)


# ------------------------------------------------------------------ ranks and callables
def test_dist_info_from_a_submitit_slurm_environment(monkeypatch):
    for k in ("SUBMITIT_EXECUTOR", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.dist_info() == DistInfo(0, 1, 0)  # outside a job: one process
    env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "1234", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
           "SLURM_LOCALID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    job_env = distributed.job_environment()
    assert distributed.dist_info(job_env) == DistInfo(rank=5, world_size=8, local_rank=1)
    assert distributed.rendezvous(job_env) == ("gpu07", distributed.PORT_BASE + 1234)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert distributed.rendezvous(job_env)[0] == "127.0.0.1"  # one node: loopback, no name resolution


def test_callables_pickle_paths_only_and_checkpoint_resubmits_the_same_call():
    job = Job("train", dict(grid="/g/table10.yaml", run_id="r1", mode="cluster", run_dir="/runs/r1",
                            data_root="/data", threads=8, parallel="fsdp"))
    again = pickle.loads(pickle.dumps(job))
    assert again == job and len(pickle.dumps(job)) < 1000
    delayed = job.checkpoint()
    assert delayed.function == job and delayed.function is not job and delayed.args == ()
    ev = Job("eval", dict(grid="g", run_id="r", mode="local", run_dir="d", out="o.parquet", data_root="data"))
    assert ev.checkpoint().function == ev


def test_launcher_imports_no_torch():
    code = ("import sys, mor.launch.__main__, mor.launch.checkpointable, mor.launch.presets, mor.launch.slurm, mor.launch.plan, mor.throughput_protocol; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=deadline(600),  # a hang guard only
                   env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})


def test_the_snakefile_imports_no_torch():
    """Every mor module the Snakefile and workflows/rules/*.smk import (at the top or inside their
    functions) and every job kind's settings hook (mor.jobs: the rules' params) runs in
    Snakemake's own process while it builds the DAG, and loads without torch: a dry run or a
    status query should not pay for it. The throughput protocol lives in
    mor.throughput_protocol and the eval kind's settings in mor.eval.settings for that reason."""
    import re

    from mor.jobs import KINDS

    sources = [REPO / "Snakefile", *sorted((REPO / "workflows" / "rules").glob("*.smk"))]
    modules = {m for f in sources for m in re.findall(r"^\s*(?:from|import)\s+(mor(?:\.\w+)*)", f.read_text(), re.M)}
    hooks = {k.settings.split(":")[0] for k in KINDS.values() if k.settings}
    assert {"mor.throughput_protocol", "mor.eval.settings"} <= hooks and len(modules) > 10, (modules, hooks)
    modules = sorted(modules | hooks)
    code = f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; " \
           "bad = 'torch' in sys.modules; print(bad); assert not bad, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=deadline(600),  # a hang guard only
                   env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})


def test_local_launcher_trains_and_evaluates_inline(data_root, tmp_path):
    grid = tiny_grid_file(tmp_path / "tiny.yaml")
    run_id = load_grid(grid, "local").runs[0].run_id
    common = ["--grid", str(grid), "--run-id", run_id, "--mode", "local", "--run-dir", str(tmp_path / "run"),
              "--data-root", str(data_root), "--threads", "1"]
    assert launch_main(["train", *common]) == 0
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 4 and summary["world_size"] == 1
    assert launch_main(["eval", *common, "--out", str(tmp_path / "row.parquet")]) == 0
    assert (tmp_path / "row.parquet").stat().st_size > 0
    assert not (tmp_path / "logs").exists()  # inline: nothing submitted


def test_unknown_run_id_is_an_error_naming_the_grid(tmp_path, capsys):
    rc = launch_main(["train", "--grid", str(REPO / "grids" / "table10.yaml"), "--run-id", "no-such-run",
                      "--run-dir", str(tmp_path), "--launcher", "slurm"])
    assert rc == 2 and "table10.yaml: no run with id 'no-such-run'" in capsys.readouterr().err


# ------------------------------------------------------------------ FSDP on 2 gloo ranks


def _fsdp_worker(rank, world, run, tokens, run_dir, port):
    import os

    os.environ["MASTER_PORT"] = str(port)
    info = distributed.init_distributed("cpu", env=_FakeEnv(rank, world))
    try:
        cls = trainer_class("fsdp")
        first = cls(run, run_dir, tokens, VOCAB, device="cpu", dist=info, progress=False)
        for _ in range(4):  # "preempted" after the step-4 checkpoint
            first.train_step()
        first.save()
        resumed = cls(run, run_dir, tokens, VOCAB, device="cpu", dist=info, progress=False)
        summary = resumed.fit()
        if rank == 0:
            (run_dir / "rank0.json").write_text(json.dumps(summary))
    except BaseException:
        distributed.shutdown()
        raise
    distributed.shutdown(barrier=True)  # as the train job's success path (checkpointable)


FSDP_RUNS = {
    "recursive": dict(variant="recursive", tying="cycle", nr=2),
    # token-choice with loss-free balancing: the bias is a frozen parameter of the sharded root
    # unit, updated after each optimizer step from the loads of every rank
    "mor-tc-loss-free": dict(variant="mor", tying="cycle", nr=3, router=RouterConfig(
        type="token_choice", balancing="loss_free", bias_update_rate=1e-4)),
    # expert-choice with an auxiliary router (a head trained on detached states) and KV sharing
    "mor-ec-aux-router-shared": dict(variant="mor", tying="middle_cycle", nr=2, kv="shared",
                                     router=RouterConfig(aux="aux_router")),
    # relaxations under KV sharing: DoRA's hooks read the gathered tied weight; prefix and the
    # shared KV call project_kv outside the layer's forward
    "relax-dora": dict(variant="recursive", tying="middle_cycle", nr=2, kv="shared", relaxation="dora",
                       relaxation_rank=2),
    "relax-prefix": dict(variant="recursive", tying="middle_cycle", nr=2, kv="shared", relaxation="prefix",
                         relaxation_rank=2),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FSDP_RUNS))
def test_fsdp_on_two_gloo_ranks_resumes_to_the_single_process_result(data_root, tmp_path, kind):
    """2 processes shard a recursive model (a layer called twice per forward) with FSDP2,
    stop after the step-4 checkpoint, resume, and end where one process ends that trains on
    the same sequences: same final loss, same parameters (up to float summation order: max diff ~3e-6).
    The MoR and relaxation cases cover what runs outside a layer's forward under FSDP."""
    from safetensors.torch import load_file

    run = tiny_run(steps=8, batch=4, **FSDP_RUNS[kind])
    run = replace(run, train=replace(run.train, micro_batch=2))  # the ranks' micro-batch: 4 sequences / 2 ranks
    tokens = data_root / "tokens" / f"train-bpe-{VOCAB}.npy"
    torch.multiprocessing.spawn(_fsdp_worker, args=(2, run, tokens, tmp_path / "fsdp", _free_port()), nprocs=2, join=True)
    got = json.loads((tmp_path / "fsdp" / "rank0.json").read_text())
    ref, ref_summary = single_process_reference(run, tmp_path / "ref", tokens, world=2)
    assert got["resumed_from"] == 4 and got["steps"] == 8 and got["world_size"] == 2
    assert got["final_loss"] == pytest.approx(ref_summary["final_loss"], rel=1e-5)
    final = load_file(str(tmp_path / "fsdp" / "final" / "model.safetensors"))
    for n, p in ref.model.named_parameters():
        # float summation order differs between 2 sharded ranks and one process (and with the
        # thread count earlier tests leave): ~3e-6 typically, up to 1.6e-5 seen on one element
        # of 2048, where AdamW normalises a near-zero gradient; a real error moves weights by
        # ~lr = 3e-3 a step, over many elements
        # (issue 54: seen 1.5e-4 on 5 of 131,072 embedding elements with the authors' model defaults).
        # So: nearly every element within float tolerance, and none moved by a step's worth (lr)
        diff = (final[n] - p.detach()).abs()
        off = diff > 3e-5 + 1e-4 * p.detach().abs()
        assert off.float().mean() < 1e-3, f"{n}: {int(off.sum())} of {off.numel()} elements differ, max {diff.max():.3g}"
        assert diff.max() < run.train.lr / 2, f"{n}: an element moved by {diff.max():.3g} (lr {run.train.lr})"
    if kind == "mor-tc-loss-free":  # the sharded bias moved, by the same steps as in one process
        assert final["routers.0.bias"].abs().sum() > 0
    steps = [json.loads(x)["step"] for x in (tmp_path / "fsdp" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [5, 6, 7, 8]  # steps 1-4 ran outside fit (no log lines); the resumed fit logs each step once
