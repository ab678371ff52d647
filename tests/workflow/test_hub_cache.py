"""The one job that reaches the hub (``mor.lm_eval.hub_cache``) and the offline default of
every other job kind: offline here, against local folders laid out as the hub's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers.paths import REPO
from mor.data.paths import DataPaths
from mor.data.shards import FORMAT
from mor.data.tokenizer import load_tokenizer, vocab_size
from mor.jobs import KINDS, JobKind


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return dict(env, PYTHONPATH=str(REPO / "src"), HF_HOME=str(tmp_path / "hf-home"), **extra)


def _hub(args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mor.launch", "hub", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_hub_job_caches_a_tokenizer_and_writes_its_manifest(tmp_path, data_root):
    """A tokenizer folder as the hub serves it (tokenizer.json + tokenizer_config.json): the job
    records the vocabulary that loading the file gives, and the manifest is its last write."""
    pytest.importorskip("transformers")
    folder = tmp_path / "SmolLM-like"
    folder.mkdir()
    shutil.copy(data_root / "tokenizer" / "bpe-4096.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    out = tmp_path / "hub" / "manifest.json"
    proc = _hub(["--out", str(out), "--tokenizer", str(folder)], _env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads(out.read_text())
    want = load_tokenizer(data_root / "tokenizer" / "bpe-4096.json").vocab_size
    assert manifest["tokenizers"] == {str(folder): want} and manifest["tasks"] == {}
    assert manifest["HF_HOME"] == str(tmp_path / "hf-home")
    assert f"(vocab {want})" in proc.stdout


def test_hub_job_offline_names_what_it_could_not_fetch_and_writes_nothing(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "manifest.json"
    proc = _hub(["--out", str(out), "--tokenizer", "no-such-org/no-such-tokenizer"], _env(tmp_path, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 2
    assert "tokenizer 'no-such-org/no-such-tokenizer' could not be loaded" in proc.stderr
    assert "on a node that reaches the hub (HF_HUB_OFFLINE is set here)" in proc.stderr
    assert not out.exists()


def test_hub_job_refuses_our_offline_tasks(tmp_path):
    proc = _hub(["--out", str(tmp_path / "m.json"), "--task", "mor_piqa"], _env(tmp_path))
    assert proc.returncode == 2 and "['mor_piqa'] are our offline copies" in proc.stderr


def test_every_kind_but_hub_and_data_runs_offline(monkeypatch):
    """``JobKind.run`` sets the kind's environment before the domain function runs; a user's
    explicit setting wins."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert {k for k, spec in KINDS.items() if spec.online} == {"hub", "data"}
    probe = JobKind("probe", "os:getenv", preset=None, outputs=(), summary="builtins:str")
    assert probe.run(key="HF_HUB_OFFLINE") == "1" and os.environ["HF_DATASETS_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert probe.run(key="HF_HUB_OFFLINE") == "0"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    online = JobKind("probe", "os:getenv", preset=None, outputs=(), summary="builtins:str", online=True)
    assert online.run(key="HF_HUB_OFFLINE") is None


def _manifest(path, name: str, vocab: int):
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"format": FORMAT, "shards": [],
                                                    "tokenizer": {"name": name, "vocab_size": vocab, "eos_id": 0}}))
    return path / "manifest.json"


def test_vocab_size_of_a_hub_tokenizer_comes_from_the_corpus_manifest(tmp_path, data_root):
    """No job loads a hub tokenizer for its size: the prepared corpus's manifest records it."""
    hub = "HuggingFaceTB/SmolLM-135M"
    m = _manifest(tmp_path / "train", hub, 49152)
    assert vocab_size(DataPaths(hub, m, m)) == 49152
    other = _manifest(tmp_path / "other", "gpt2", 50257)
    with pytest.raises(ValueError, match=f"{other}.*not '{hub}'"):
        vocab_size(DataPaths(hub, other, other))
    local = data_root / "tokenizer" / "bpe-4096.json"
    assert vocab_size(DataPaths(str(local), m, m)) == load_tokenizer(local).vocab_size
