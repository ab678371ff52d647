"""Snakemake through the local profile, for the workflow tests: the command (its whole process
group killed if the wait ends early), a dry run's job counts, the tiny end-to-end grids, and
the validation NLL a run's final weights should have been scored with."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from helpers.paths import REPO
from helpers.procs import run_group


SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(*args, cwd=REPO, check=True):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = run_group([*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "local"), *args],
                     cwd=cwd, env=env, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def job_counts(output: str) -> dict[str, int]:
    block = output.split("Job stats:")[1].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M) if m.group(1) != "total"}


# The local mode of the test grids: the tiny scale, 16 steps of 8 x 64 tokens, a short eval.
TINY_LOCAL_MODE = """modes:
  local:
    scale_map: {135M: tiny}
    set:
      train: {tokens: 8192, seq_len: 64, global_batch: 8, micro_batch: 8, checkpoint_every: 8}
      eval: {nll_tokens: 2048, batch: 8}
"""


E2E_GRID = """
name: e2e
artifacts: [tables/table10, figures/fig6]
defaults:
  data: {source: django-docs, tokenizer: bpe-4096}
runs:
  - label: Vanilla
    set: {model.variant: vanilla}
    axes: {model.scale: [135M]}
  - label: "{model_tying}"
    set: {model.variant: recursive, model.num_recursions: 2}
    axes: {model.scale: [135M], model.tying: [middle_cycle]}
""" + TINY_LOCAL_MODE + """reference:
  - {paper_scale: 135M, variant: recursive, tying: middle_cycle, num_recursions: 2, val_nll: 3.0330}
"""


def reference_nll(workdir: Path, row: dict, data_root: Path) -> float:
    """Validation NLL of a run's final weights, from the model's training loss (F.cross_entropy)
    over the eval job's windows: consecutive seq_len + 1 tokens of the validation split."""
    import json

    import numpy as np
    import torch

    from mor.config import run_config_from_dict
    from mor.layout import run_dir
    from mor.trained import open_run

    cfg = run_config_from_dict(json.loads(row["config_json"]))
    model = open_run(run_dir(workdir / "runs", row["run_id"]), cfg, "cpu", vocab_size=4096).model
    t = cfg.train.seq_len
    val = np.load(data_root / "tokens" / "val-bpe-4096.npy")
    n = min(len(val) // (t + 1), cfg.eval.nll_tokens // t)
    windows = torch.from_numpy(val[: n * (t + 1)].astype(np.int64)).view(n, t + 1)
    with torch.no_grad():
        losses = [model(w[None, :-1], w[None, 1:]).lm_loss.item() for w in windows]
    assert row["val_tokens"] == n * t
    return sum(losses) / n


def plan(workdir: Path, grids: Path, data_root: Path, *targets: str) -> dict[str, int]:
    """Job counts of a dry run (`-n`) of ``targets`` ({} when nothing is to be done)."""
    out = snakemake(*targets, "-n", "--directory", str(workdir), "--config", f"grids_dir={grids}",
                    f"data_root={data_root}")
    text = out.stdout + out.stderr
    return {} if "Nothing to be done" in text else job_counts(text)
