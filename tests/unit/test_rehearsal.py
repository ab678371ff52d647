"""The rehearsal's pieces with the CPU torch (fake CPU tensors): failure naming, the memory
counter, synthetic data, the table, and one DDP train step through the train job."""

from __future__ import annotations

import csv
import io

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from mor.data.paths import DataPaths
from mor.data.sampler import load_tokens
from mor.data.tokenizer import vocab_size
from mor.launch.presets import Preset
from mor.rehearsal import jobs
from mor.rehearsal.data import write_split
from mor.rehearsal.fake import RehearsalError, fake_device
from mor.rehearsal.jobs import Row, rehearse
from mor.rehearsal.measure import GiB, StorageTracker
from mor.rehearsal.table import COLUMNS, to_csv, to_markdown

GRID = """
name: rehearse_ci
description: two variants for the rehearsal's test
runs:
  - name: vanilla
    set: {model.variant: vanilla}
    axes: {model.scale: [135M]}
  - name: recursive
    set: {model.variant: recursive, model.num_recursions: 2, model.tying: cycle}
    axes: {model.scale: [135M]}
  - name: token
    set: {model.variant: mor, model.num_recursions: 2, model.tying: middle_cycle, model.router.type: token_choice,
          model.router.func: softmax}
    axes: {model.scale: [135M]}
modes:
  local: {scale_map: {135M: tiny}, set: {train.tokens: 4096, train.global_batch: 8, train.micro_batch: 4,
                                         eval.batch: 4, eval.lm_eval_tasks: [piqa]}}
"""


def test_a_failure_names_the_run_the_job_and_the_op():
    with pytest.raises(RehearsalError) as e:
        with fake_device("run-1", "train", "cpu"):
            torch.ones(2, 3) + torch.ones(2, 3, device="meta")  # two devices in one op
    assert (e.value.run_id, e.value.job, e.value.op) == ("run-1", "train", "aten.add.Tensor")
    assert str(e.value).startswith("run-1 / train: failed in aten.add.Tensor: ")


def test_tensors_are_fake_and_a_scalar_read_is_a_stand_in():
    with fake_device("r", "train", "cpu"):
        big = torch.ones(1 << 20, 1 << 20)  # 4 TiB: nothing is allocated
        assert isinstance(big, FakeTensor) and big.shape == (1 << 20, 1 << 20)
        assert float(big.sum()) == 1.0 and big.sum().item() == 1.0


def test_storage_tracker_counts_parameters_gradients_and_moments():
    with fake_device("r", "train", "cpu"):
        model = torch.nn.Linear(64, 32)
        opt = torch.optim.AdamW(model.parameters())
        p_bytes = (64 * 32 + 32) * 4
        jobs._create_moments(model, opt)  # moments exist before the tracker starts, as from step 2 on
        with StorageTracker(model, opt) as mt:
            model(torch.ones(8, 64)).sum().backward()
            opt.step()
        peak = mt.peak
    assert peak["params"] == p_bytes
    assert peak["grads"] == p_bytes  # both gradients alive while AdamW steps
    assert 2 * p_bytes <= peak["optimizer"] <= 2 * p_bytes + 2 * 64 + 4 * p_bytes  # moments (+ step counts, temporaries)
    assert peak["total"] == sum(peak[k] for k in ("params", "grads", "optimizer", "transient"))


def test_synthetic_tokens_read_back_through_the_jobs_loader(tmp_path):
    manifest = write_split(tmp_path / "train", "HuggingFaceTB/SmolLM-135M", 49152, tokens=10_000)
    tokens = load_tokens(manifest)  # checks each shard's size and sha256
    assert len(tokens) == 10_000 and int(tokens[:].max()) < 49152
    assert vocab_size(DataPaths("HuggingFaceTB/SmolLM-135M", manifest, manifest)) == 49152


def test_table_counts_and_columns():
    ok = Row("a", "train", 2, 8, "ok", 80.0, measured={"params": GiB, "grads": GiB, "optimizer": 2 * GiB,
                                                        "transient": 3 * GiB, "total": 7 * GiB},
             modelled={"params": GiB, "grads": GiB, "optimizer": 2 * GiB, "transient": 4 * GiB, "total": 8 * GiB})
    bad = Row("b", "train", 2, 0, "FAILED: b / train: failed in aten.mm.default: boom", 80.0)
    rows = list(csv.DictReader(io.StringIO(to_csv([ok, bad]))))
    assert list(rows[0]) == COLUMNS
    assert (rows[0]["measured_transient_gib"], rows[0]["modelled_transient_gib"]) == ("3.00", "4.00")
    assert rows[1]["status"].startswith("FAILED") and rows[1]["measured_total_gib"] == ""
    md = to_markdown([ok, bad], "t")
    assert "2 job(s): 1 passed, 1 failed, 0 not rehearsed" in md and "| 7.00 / 8.00 |" in md


def test_the_target_fails_on_a_failed_row_and_passes_without(tmp_path, capsys):
    from mor.rehearsal.table import check, write

    ok = Row("a", "train", 2, 8, "ok", 80.0)
    bad = Row("b", "train", 2, 0, "FAILED: b / train: failed in aten.mm.default: boom", 80.0)
    csv_path, md_path = write([ok, bad], tmp_path / "g", "g")
    assert md_path.read_text().startswith("# Rehearsal: g")
    assert check(csv_path) == 1 and "b train: FAILED" in capsys.readouterr().out
    assert check(write([ok], tmp_path / "h", "h")[0]) == 0


@pytest.fixture
def grid(tmp_path):
    path = tmp_path / "rehearse_ci.yaml"
    path.write_text(GRID)
    return str(path)


def _runs(grid):
    from mor.grids import load_grid

    return [r.config for r in load_grid(grid, "local").runs]


PRESET = Preset(gpus_per_node=2, gpu_memory_gib=80.0, execution={"micro_batch": 2})  # DDP over 2 fake ranks


@pytest.mark.parametrize("variant", ["vanilla", "recursive"])
def test_one_ddp_train_step_through_the_train_job(grid, data_root, variant):
    from mor.flops import param_count
    from mor.config import model_shape

    run = next(r for r in _runs(grid) if r.model.variant == variant)
    row = rehearse("train", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert row.status == "ok", row.status
    assert (row.world_size, row.micro_batch) == (2, 2)
    P = param_count(run.model, model_shape(run.model), vocab_size_of(data_root, run))
    assert row.measured["grads"] == 4 * P == row.modelled["grads"]  # every parameter's fp32 gradient, once
    assert row.measured["optimizer"] >= 8 * P  # AdamW's two fp32 moments
    assert row.measured["params"] >= 4 * P
    assert row.measured["transient"] > 0


def test_token_choice_train_runs_on_fake_tensors_and_says_its_memory_is_not_measured(grid, data_root):
    """Its balancing loss once failed on bincount's data-dependent shape; now the step runs, and
    the row says the packed sizes (read back from the routing) are fake, so the measured transient
    is a floor, not a measurement (never a plain 'ok' beside a wrong number)."""
    run = next(r for r in _runs(grid) if r.model.variant == "mor")
    row = rehearse("train", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert row.status.startswith("ok (memory not measured: token-choice"), row.status
    assert row.measured["grads"] == row.modelled["grads"] > 0  # the parameters are the run's


def vocab_size_of(data_root, run):
    from mor.data.paths import data_paths

    return vocab_size(data_paths(run.data, data_root))


def test_a_failure_inside_the_train_job_is_a_row_naming_it(grid, data_root, monkeypatch):
    from mor.train.trainer import Trainer

    def as_floats(self):  # token ids of the wrong dtype, as a path only one device takes could make them
        x = torch.zeros(self.micro, self.run.train.seq_len)
        yield x, x.long()

    monkeypatch.setattr(Trainer, "micro_batches", as_floats)
    run = _runs(grid)[0]
    row = rehearse("train", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert row.status.startswith(f"FAILED: {run.run_id} / train: failed in aten.embedding.default: ")


def test_a_peak_over_the_usable_memory_fails_the_row(grid, data_root):
    small = Preset(gpus_per_node=2, gpu_memory_gib=2.0, execution={"micro_batch": 2})  # 0.3 GiB usable
    run = _runs(grid)[0]
    row = rehearse("train", grid, run.run_id, "local", small, "cpu", data_root)
    if row.measured["total"] > 0.3 * GiB:
        pytest.fail("the tiny model should fit 0.3 GiB; pick a smaller GPU for this test")
    tiny = Preset(gpus_per_node=2, gpu_memory_gib=1.668, execution={"micro_batch": 2})  # 0.0012 GiB usable
    row = rehearse("train", grid, run.run_id, "local", tiny, "cpu", data_root)
    assert row.status.startswith("FAILED: measured peak") and "usable of the 1.668 GiB GPU at micro-batch 2" in row.status


@pytest.mark.parametrize("variant", ["vanilla", "recursive"])
def test_eval_and_lmeval_through_their_jobs_with_the_weight_read_skipped(grid, data_root, variant):
    from mor.config import model_shape
    from mor.flops import param_count
    from mor.rehearsal.jobs import LMEVAL_CONTINUATION

    run = next(r for r in _runs(grid) if r.model.variant == variant)
    V, T = vocab_size_of(data_root, run), run.train.seq_len
    P = param_count(run.model, model_shape(run.model), V)
    ev = rehearse("eval", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert ev.status == "ok (weights not read)" and ev.route == "fake cpu eval", ev.status
    assert ev.micro_batch == 4 and 4 * P <= ev.measured["params"] <= 1.1 * 4 * P  # the full fp32 model (+ buffers)
    assert ev.measured["transient"] >= 2 * 4 * T * V * 4  # the batch's fp32 logits and log-probs, alive together
    assert ev.modelled == {}  # mor.memory has no estimate for eval: measured only
    lm = rehearse("lmeval", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert lm.status.startswith("ok (weights not read") and lm.micro_batch == 16, lm.status  # max(16, eval.batch)
    assert lm.measured["params"] == ev.measured["params"]
    assert lm.measured["transient"] >= 16 * LMEVAL_CONTINUATION * V * 4  # the scored positions' logits


def test_a_failure_inside_the_eval_job_is_a_row_naming_it(grid, data_root, monkeypatch):
    from mor.eval import job as eval_job

    def mixed_devices(model, tokens, seq_len, max_tokens, batch, device):
        logits = model(torch.zeros(1, 4, dtype=torch.long)).logits
        return logits + torch.zeros(1, 4, logits.shape[-1], device="meta")  # a tensor made on another device

    monkeypatch.setattr(eval_job, "evaluate", mixed_devices)
    run = _runs(grid)[0]
    row = rehearse("eval", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert row.status.startswith(f"FAILED: {run.run_id} / eval: failed in aten.add.Tensor: "), row.status
    assert row.world_size == 1  # one process, whatever the train preset's world


@pytest.mark.parametrize("variant", ["vanilla", "recursive"])
def test_throughput_engine_passes_through_the_job_at_both_batches(grid, data_root, variant):
    """The throughput job's own engine sizing (local protocol: 0.05 GiB, fp32), each eager pass
    kind once at full rows on fake CPU; the measured pool against the job's memory budget."""
    from mor.config import model_shape
    from mor.flops import model_bytes, param_count
    from mor.throughput_protocol import load_protocol, sequence_len

    run = next(r for r in _runs(grid) if r.model.variant == variant)
    V = vocab_size_of(data_root, run)
    p = load_protocol("local")
    row = rehearse("throughput", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert row.status == "ok (weights not read; eager passes without the scheduler; no graph capture)", row.status
    assert row.route.startswith("fake cpu engine passes; batch 32: ") and "sdpa_gathered" in row.route, row.route
    budget = p["memory_gib"] * GiB  # the job's engine memory where the protocol states it
    P = model_bytes(run.model, model_shape(run.model), V, 4)
    assert row.modelled == {"params": float(P), "transient": budget - P, "total": budget}
    assert param_count(run.model, model_shape(run.model), V) * 4 <= row.measured["params"] <= 1.1 * P
    # the KV pool: every whole block of 16 entries the budget holds after the parameters (and
    # the trash block), K and V, fp32; the passes' temporaries on top of it
    s = model_shape(run.model)
    block = 2 * 16 * s.kv_heads * s.head_dim * 4
    pool = (int((budget - P) // block) + 1) * block
    assert row.measured["transient"] > pool and f"KV pool {pool / GiB:.2f}" in row.route
    assert row.measured["transient"] < pool + 0.1 * budget  # a decode pass is small beside the pool
    assert row.micro_batch >= p["fixed_batch"] and row.route.count("context ") == 2
    assert f"context {sequence_len(p) - 2}" in row.route  # every row at the longest context


def test_a_failure_inside_the_engine_is_a_throughput_row_naming_it(grid, data_root, monkeypatch):
    from mor.engine.step import Stepper

    block = Stepper.block

    def mixed_devices(self, slots, depths, pos, shape=None):
        block(self, slots, depths, pos, shape)
        return self.h + torch.zeros(1, device="meta")  # a tensor made on another device

    monkeypatch.setattr(Stepper, "block", mixed_devices)
    run = _runs(grid)[0]
    row = rehearse("throughput", grid, run.run_id, "local", PRESET, "cpu", data_root)
    assert row.status.startswith(f"FAILED: {run.run_id} / throughput: failed in aten.add.Tensor: "), row.status
