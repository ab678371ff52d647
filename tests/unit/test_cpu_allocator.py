"""The allocator tuning must stop the per-step page faults it exists to stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mor.cpu_allocator import _glibc

PROBE = r"""
import json, resource
import torch
from mor.cpu_allocator import tune_cpu_allocator
from mor.config import ModelConfig, load_scales
from mor.model.transformer import build_model
tuned = tune_cpu_allocator()
torch.manual_seed(0)
cfg = ModelConfig(scale="small", variant="recursive", tying="middle_cycle", num_recursions=3)
model = build_model(cfg, load_scales()["small"], 4096).train()
x = torch.randint(0, 4096, (16, 128))  # the local training batch: 32 MiB logits
faults = []
for _ in range(6):  # training steps: activations, logits and gradients freed every step
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x, x).loss.backward()
    model.zero_grad(set_to_none=True)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"tuned": tuned, "faults": sum(faults[3:])}))
"""


def probe(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["MOR_CPU_ALLOCATOR"] = setting
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two subprocesses of six small-scale training steps
@pytest.mark.skipif(_glibc() is None, reason="mallopt thresholds exist only in glibc")
def test_tuned_allocator_reuses_freed_blocks_instead_of_faulting_them_in_again():
    default, tuned = probe("default"), probe("tuned")
    assert default["tuned"] is False and tuned["tuned"] is True
    assert default["faults"] > 0  # glibc unmaps freed logits and faults them in again
    assert tuned["faults"] * 4 < default["faults"]


def test_user_glibc_settings_win(monkeypatch):
    import mor.cpu_allocator as ca

    monkeypatch.setattr(ca, "_tuned", False)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert ca.tune_cpu_allocator() is False
