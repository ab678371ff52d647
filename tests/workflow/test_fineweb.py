"""The FineWeb-Edu preparation, run for real on a local dataset of the same schema.

The dataset is a few thousand documents (the paragraphs of the embedded corpus's train
split, in 3 parquet files with a ``text`` column, as the hub's fineweb-edu-dedup files
have). Every preparation here runs ``python -m mor.launch data`` in its own process with 2
worker processes, offline (HF_HUB_OFFLINE), and the local BPE stands in for the SmolLM
tokenizer through the same ``load_tokenizer``. Expected tokens are derived independently:
each document encoded on its own (``encode``, not the batch call), EOS after it, in order.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.deadlines import deadline
from helpers.paths import REPO
from mor.data.sampler import TokenSampler, load_tokens
from mor.data.shards import Chunk, Position, ShardError, ShardedTokens, write_shards
from mor.data.tokenizer import load_tokenizer
from mor.data.tokens import read_documents

FILES = 3
SHARD = 20_000
VAL = 15_000
TRAIN = 300_000


def write_settings(path: Path, source: Path, *, name=None, train=TRAIN, val=VAL, shard=SHARD, split="head",
                   extra: str = "") -> Path:
    path.write_text(f"source: {{path: {source}, name: {name or 'null'}}}\ntrain_tokens: {train}\nval_tokens: {val}\n"
                    f"shard_tokens: {shard}\nval_split: {split}\nbatch_docs: 64\n{extra}")
    return path


def env(tmp: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                HF_HOME=str(tmp / "hf-home"))


def prepare_cmd(settings: Path, out: Path, tokenizer: Path, workers: int = 2) -> list[str]:
    return [sys.executable, "-m", "mor.launch", "data", "--settings", str(settings), "--tokenizer", str(tokenizer),
            "--out", str(out), "--workers", str(workers)]


def run_prepare(settings: Path, out: Path, tokenizer: Path, tmp: Path, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(prepare_cmd(settings, out, tokenizer), env=env(tmp), capture_output=True, text=True,
                          timeout=deadline(600))
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def tokenizer(data_root) -> Path:
    return data_root / "tokenizer" / "bpe-4096.json"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, data_root) -> tuple[Path, list[list[str]]]:
    """3 parquet files of ~4,600 documents (5 paragraphs each) of the embedded corpus's train
    split, 669K tokens: (folder, documents per file)."""
    return write_dataset(tmp_path_factory.mktemp("fineweb-like"), documents(data_root), FILES)


def documents(data_root: Path) -> list[str]:
    paragraphs = [p.strip() for d in read_documents(data_root / "corpus" / "train.txt") for p in d.split("\n\n")
                  if p.strip()]
    return ["\n\n".join(paragraphs[i:i + 5]) for i in range(0, len(paragraphs), 5)]


def write_dataset(folder: Path, docs: list[str], files: int) -> tuple[Path, list[list[str]]]:
    folder.mkdir(parents=True, exist_ok=True)
    per_file = [docs[len(docs) * i // files:len(docs) * (i + 1) // files] for i in range(files)]
    for i, docs in enumerate(per_file):
        table = pa.table({"text": docs, "id": [f"{i}-{j}" for j in range(len(docs))]})
        pq.write_table(table, folder / f"train-{i:05d}-of-{files:05d}.parquet", row_group_size=400)
    return folder, per_file


def stream(tok, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The documents' tokens, each encoded alone, EOS after each; and where each document starts."""
    parts = [np.asarray(tok.encode(d) + [tok.eos_id], dtype=np.int64) for d in docs]
    starts = np.cumsum([0] + [len(p) for p in parts])[:-1]
    return np.concatenate(parts), starts


def flat(manifest: Path) -> np.ndarray:
    return np.asarray(load_tokens(manifest)[:], dtype=np.int64)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, dataset, tokenizer) -> Path:
    """One uninterrupted preparation (head split): the folder with val/ and train/."""
    tmp = tmp_path_factory.mktemp("reference")
    settings = write_settings(tmp / "fineweb.yaml", dataset[0])
    run_prepare(settings, tmp / "out", tokenizer, tmp)
    return tmp / "out"


def test_shards_are_the_documents_tokenized_in_order(reference, dataset, tokenizer):
    tok = load_tokenizer(tokenizer)
    docs = [d for file_docs in dataset[1] for d in file_docs]  # file order
    want, starts = stream(tok, docs)
    val_m = json.loads((reference / "val" / "manifest.json").read_text())
    train_m = json.loads((reference / "train" / "manifest.json").read_text())

    # val: the first VAL tokens; train: TRAIN tokens from the first document after the cut one
    assert np.array_equal(flat(reference / "val" / "manifest.json"), want[:VAL])
    cut_doc = int(np.searchsorted(starts, VAL - 1, side="right")) - 1  # the document holding val's last token
    train_start = starts[cut_doc + 1]
    assert np.array_equal(flat(reference / "train" / "manifest.json"), want[train_start:train_start + TRAIN])
    # disjoint by document: val ends inside document cut_doc, train begins with the next one
    assert train_m["start"] == {"file": 0, "row": cut_doc + 1, "offset": 0}
    assert val_m["end"] == {"file": 0, "row": cut_doc, "offset": VAL - int(starts[cut_doc])}
    assert "first documents" in val_m["documents"] and "after the validation set" in train_m["documents"]

    # fixed-size shards, memory-mapped uint16, whose sha256 and sizes the manifest records
    assert [s["tokens"] for s in train_m["shards"]] == [SHARD] * (TRAIN // SHARD)
    for m, split in ((train_m, "train"), (val_m, "val")):
        assert m["dtype"] == "uint16" and m["tokens"] == sum(s["tokens"] for s in m["shards"])
        assert m["tokenizer"] == {"name": str(tokenizer), "vocab_size": 4096, "eos_id": 0}
        assert m["source"]["path"] == str(dataset[0]) and len(m["source"]["files"]) == FILES
        for s in m["shards"]:
            path = reference / split / s["file"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == s["sha256"] and path.stat().st_size == s["bytes"]
            assert np.load(path, mmap_mode="r").dtype == np.uint16
    # each shard's recorded start is where its tokens begin in the document stream
    first_doc = np.cumsum([0] + [len(f) for f in dataset[1]])  # global index of each file's row 0
    for i, s in enumerate(train_m["shards"]):
        p = s["start"]
        assert starts[first_doc[p["file"]] + p["row"]] + p["offset"] - train_start == i * SHARD
    assert {s["start"]["file"] for s in train_m["shards"]} == {0, 1}  # crosses a file boundary


def test_last_file_split_never_trains_on_the_validation_file(tmp_path, dataset, tokenizer):
    tok = load_tokenizer(tokenizer)
    settings = write_settings(tmp_path / "fineweb.yaml", dataset[0], split="last_file", train=120_000)
    run_prepare(settings, tmp_path / "out", tokenizer, tmp_path)
    val_want, _ = stream(tok, dataset[1][-1])
    train_want, _ = stream(tok, [d for f in dataset[1][:-1] for d in f])
    assert np.array_equal(flat(tmp_path / "out" / "val" / "manifest.json"), val_want[:VAL])
    assert np.array_equal(flat(tmp_path / "out" / "train" / "manifest.json"), train_want[:120_000])
    m = json.loads((tmp_path / "out" / "train" / "manifest.json").read_text())
    assert m["stop_file"] == FILES - 1 and all(s["end"]["file"] < FILES - 1 for s in m["shards"])
    assert "last data file" in json.loads((tmp_path / "out" / "val" / "manifest.json").read_text())["documents"]


def test_json_copy_of_the_local_corpus_gives_the_local_token_array(tmp_path, data_root, tokenizer):
    """The embedded corpus as a JSON-lines dataset -> shards whose values, and whose sampled
    training batches, are exactly those of data/tokens/train-bpe-4096.npy (one data code path)."""
    docs = read_documents(data_root / "corpus" / "train.txt")
    src = tmp_path / "django-json"
    src.mkdir()
    with open(src / "train.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    flat_local = np.load(data_root / "tokens" / "train-bpe-4096.npy", mmap_mode="r")
    train = 400_000
    settings = write_settings(tmp_path / "fineweb.yaml", src, train=train, val=2_000, shard=30_000)
    run_prepare(settings, tmp_path / "out", tokenizer, tmp_path)
    assert np.array_equal(flat(tmp_path / "out" / "val" / "manifest.json"), flat_local[:2_000])
    start = json.loads((tmp_path / "out" / "train" / "manifest.json").read_text())["start"]["row"]
    offset = int(np.flatnonzero(flat_local == 0)[start - 1]) + 1  # after the EOS of document start - 1
    want = np.asarray(flat_local[offset:offset + train])
    sharded = load_tokens(tmp_path / "out" / "train" / "manifest.json")
    assert len(sharded) == train and np.array_equal(np.asarray(sharded[:]), want)
    a, b = TokenSampler(sharded, 64, seed=3), TokenSampler(want, 64, seed=3)
    for step, micro, rank in [(0, 0, 0), (5, 1, 0), (17, 0, 3), (123, 2, 1)]:
        (xa, ya), (xb, yb) = a.batch(step, micro, rank, 8), b.batch(step, micro, rank, 8)
        assert xa.dtype == xb.dtype and xa.equal(xb) and ya.equal(yb)


def test_shards_written_from_the_flat_array_read_back_bit_identical(tmp_path, data_root):
    """write_shards on the local array (shard size prime, so windows cross boundaries): the
    sampler's batches and every slice equal those of the flat .npy."""
    arr = np.load(data_root / "tokens" / "train-bpe-4096.npy", mmap_mode="r")
    chunks = (Chunk(Position(0, i, 0), np.asarray(arr[i:i + 9973]), np.array([len(arr[i:i + 9973])]))
              for i in range(0, len(arr), 9973))
    shards = list(write_shards(chunks, tmp_path, 0, Position(0, 0, 0), len(arr), 7919, arr.dtype))
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "mor-token-shards/1", "dtype": arr.dtype.name,
                                                        "tokens": len(arr), "shards": shards}))
    sharded = ShardedTokens(tmp_path / "manifest.json")
    assert len(sharded) == len(arr) and len(shards) == -(-len(arr) // 7919)
    for a, b in [(0, 10), (7910, 7930), (7919, 7919 * 3 + 5), (len(arr) - 50, len(arr)), (5, 5)]:
        assert np.array_equal(sharded[a:b], arr[a:b])
    assert sharded[7919] == arr[7919] and sharded[-1] == arr[-1]
    x, y = TokenSampler(sharded, 128, 0), TokenSampler(arr, 128, 0)
    for step in range(20):
        bx, by = x.batch(step, 0, 0, 16), y.batch(step, 0, 0, 16)
        assert bx[0].equal(by[0]) and bx[1].equal(by[1])


def _peak_rss_mib(settings: Path, out: Path, tokenizer: Path, tmp: Path) -> float:
    """Peak RSS of a fresh process that runs the preparation (what the OS measured)."""
    code = ("import resource, sys; from mor.launch.__main__ import main; rc = main(sys.argv[1:]); "
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, *prepare_cmd(settings, out, tokenizer)[3:]], env=env(tmp),
                          capture_output=True, text=True, timeout=deadline(600))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return float(proc.stdout.split("PEAK")[-1])


def test_peak_memory_does_not_grow_with_the_token_count(tmp_path, data_root, tokenizer):
    """8x the tokens (shards 1/200 of them) must not need more memory: holding the 7.6M tokens
    would add 14.5 MiB as uint16 and about 300 MiB as Python lists."""
    src, _ = write_dataset(tmp_path / "x12", documents(data_root) * 12, 8)  # 8.0M tokens
    small = _peak_rss_mib(write_settings(tmp_path / "s.yaml", src, train=1_000_000, shard=38_000),
                          tmp_path / "small", tokenizer, tmp_path)
    large = _peak_rss_mib(write_settings(tmp_path / "l.yaml", src, train=7_600_000, shard=38_000),
                          tmp_path / "large", tokenizer, tmp_path)
    print(f"peak RSS: {small:.1f} MiB for 1M tokens, {large:.1f} MiB for 7.6M")
    assert large - small < 10.0


def _shards_done(progress: Path) -> int:
    try:
        return len(json.loads(progress.read_text())["shards"])
    except (OSError, ValueError, KeyError):  # not there yet (or replaced at this instant: read again)
        return 0


def test_kill_9_mid_way_resumes_to_byte_identical_shards(tmp_path, dataset, tokenizer, reference):
    """SIGKILL once 3 shards are done. Whoever wins the race, the test holds: the process group
    is frozen (SIGSTOP) before the state is read and killed while frozen, so what is read is what
    the kill leaves; if the preparation finished first (a fast machine), the same command must
    leave the finished output as it is. Either way the output ends byte-identical to the reference."""
    settings = write_settings(tmp_path / "fineweb.yaml", dataset[0])
    out = tmp_path / "out"
    proc = subprocess.Popen(prepare_cmd(settings, out, tokenizer), env=env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    progress, manifest = out / "train" / "progress.json", out / "train" / "manifest.json"
    end = time.monotonic() + deadline(300)  # a hang bound only
    try:
        while proc.poll() is None and _shards_done(progress) < 3:
            assert time.monotonic() < end, "no 3 shards done: the preparation hangs"
            time.sleep(0.01)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGSTOP)  # frozen: nothing changes between this look and the kill
        finished = manifest.exists()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=deadline(30))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    done = json.loads(progress.read_text())["shards"] if progress.exists() else []
    if not finished:
        assert not manifest.exists() and 3 <= len(done) < TRAIN // SHARD
    before = {s["file"]: (out / "train" / s["file"]).stat().st_ino for s in done}

    log = run_prepare(settings, out, tokenizer, tmp_path).stdout
    assert finished or f"{len(done)} shard(s) done" in log
    for s in done:  # finished shards were kept, not rewritten
        assert (out / "train" / s["file"]).stat().st_ino == before[s["file"]]
    for split in ("val", "train"):
        got = sorted(p.name for p in (out / split).iterdir())
        assert got == sorted(p.name for p in (reference / split).iterdir())  # no temporaries left
        for name in got:
            if name.endswith(".npy"):
                assert (out / split / name).read_bytes() == (reference / split / name).read_bytes(), name
        assert (json.loads((out / split / "manifest.json").read_text())["shards"]
                == json.loads((reference / split / "manifest.json").read_text())["shards"])


def test_a_corrupt_shard_is_named_by_its_checksum(tmp_path, reference, tokenizer, dataset):
    out = tmp_path / "out"
    subprocess.run(["cp", "-r", str(reference), str(out)], check=True)
    bad = out / "train" / "shard-00004.npy"
    data = bytearray(bad.read_bytes())
    data[1000] ^= 0xFF  # same size, one byte changed
    bad.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"token shard .*shard-00004\.npy fails its checksum"):
        load_tokens(out / "train" / "manifest.json")
    load_tokens(out / "val" / "manifest.json")  # the other split is fine
    # the preparation checks finished shards before it does anything
    settings = write_settings(tmp_path / "fineweb.yaml", dataset[0])
    proc = run_prepare(settings, out, tokenizer, tmp_path, check=False)
    assert proc.returncode != 0 and "shard-00004.npy fails its checksum" in proc.stderr
    # deleting it (as the message says) rewrites it from its recorded start, byte for byte
    bad.unlink()
    (out / "train" / "manifest.json").unlink()
    run_prepare(settings, out, tokenizer, tmp_path)
    assert bad.read_bytes() == (reference / "train" / "shard-00004.npy").read_bytes()
    load_tokens(out / "train" / "manifest.json")


def test_changed_settings_stop_a_resumed_preparation(tmp_path, reference, tokenizer, dataset):
    out = tmp_path / "out"
    subprocess.run(["cp", "-r", str(reference), str(out)], check=True)
    settings = write_settings(tmp_path / "fineweb.yaml", dataset[0], shard=25_000)
    proc = run_prepare(settings, out, tokenizer, tmp_path, check=False)
    assert proc.returncode != 0 and "other settings" in proc.stderr and "shard_tokens: recorded 20000, now 25000" in proc.stderr


def test_unfinished_preparation_is_named_when_training_reads_it(tmp_path, reference):
    out = tmp_path / "out"
    subprocess.run(["cp", "-r", str(reference), str(out)], check=True)
    (out / "train" / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="progress.json shows an unfinished preparation"):
        load_tokens(out / "train" / "manifest.json")


@pytest.mark.parametrize("body, message", [
    ("val_split: middle\n", "val_split: 'middle' is not allowed; choose one of ['head', 'last_file']"),
    ("train_tokns: 5\n", "unknown key(s) ['train_tokns']"),
    ("shard_tokens: 0\n", "shard_tokens: expected a whole number >= 1, got 0"),
    ("source: {path: x, subset: y}\n", "source: unknown key(s) ['subset']"),
])
def test_bad_settings_name_the_file_and_key(tmp_path, body, message):
    from mor.data.fineweb import SettingsError, load_settings

    path = tmp_path / "fineweb.yaml"
    path.write_text(body)
    with pytest.raises(SettingsError) as e:
        load_settings(path)
    assert str(e.value).startswith(str(path)) and message in str(e.value)


def test_repository_settings_are_the_paper_corpus():
    from mor.data.fineweb import DEFAULT_SETTINGS, load_settings

    s = load_settings(DEFAULT_SETTINGS)
    assert (s.source.path, s.source.name, s.train_tokens, s.val_tokens, s.val_split) == (
        "HuggingFaceTB/smollm-corpus", "fineweb-edu-dedup", 88_000_000_000, 10_000_000, "last_file")
    # one pass without replacement (train.data_order: pass) must hold the longest cluster run of
    # every grid (the pool is read once; a run past its end would be refused at its first step)
    from mor.grids import load_grid

    longest = max((r.config.train.steps * r.config.train.global_batch * r.config.train.seq_len + 1, g.name)
                  for g in sorted((REPO / "grids").glob("*.yaml")) if g.name != "scales.yaml"
                  for r in load_grid(g, "cluster").runs if r.config.train.data_order == "pass")
    assert longest[0] >= 14_672 * 1_024 * 2_048 + 1  # at least the authors' longest released run
    assert s.train_tokens >= longest[0], longest


def test_data_preset_is_cpu_only_and_one_task(tmp_path):
    from mor.launch.presets import PresetError, load_presets

    base = "scales:\n  tiny:\n    train: {gpus_per_node: 0}\n"
    (tmp_path / "gpu.yaml").write_text(base + "data: {gpus_per_node: 1}\n")
    with pytest.raises(PresetError, match="data: the data job .* gpus_per_node 0"):
        load_presets(tmp_path / "gpu.yaml")
    (tmp_path / "tasks.yaml").write_text(base + "data: {tasks_per_node: 2}\n")
    with pytest.raises(PresetError, match="tasks=2"):
        load_presets(tmp_path / "tasks.yaml")
    (tmp_path / "none.yaml").write_text(base)
    with pytest.raises(PresetError, match="none.yaml: key data is missing"):
        load_presets(tmp_path / "none.yaml").data
    repo = load_presets(REPO / "slurm" / "presets.yaml").data
    assert repo.gpus_per_node == 0 and repo.world_size == 1 and "gpus_per_node" not in repo.submitit_parameters("x")


def test_plan_lists_the_data_job_with_its_cpu_hours(capsys):
    from mor.launch.__main__ import main
    from mor.launch.presets import load_presets

    assert main(["plan", "--grid", str(REPO / "grids" / "table10.yaml"), "--mode", "cluster",
                 "--data-root", "/nonexistent"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("HuggingFaceTB/SmolLM-135M"))
    rate = load_presets(REPO / "slurm" / "presets.yaml").data.tokens_per_s_per_cpu
    assert "88.01B" in line and f"{88.01e9 / rate / 3600:.1f}" in line.split()
    assert out.index("FineWeb-Edu preparation") < out.index("table10 (")


def test_local_mode_plan_has_no_data_job(capsys):
    from mor.launch.__main__ import main

    assert main(["plan", "--grid", str(REPO / "grids" / "table10.yaml"), "--mode", "local"]) == 0
    assert "FineWeb-Edu" not in capsys.readouterr().out


def test_slurm_dry_run_shows_the_data_job_with_its_preset(tmp_path):
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "slurm"),
           "tables/table10", "-n", "--nolock", "--directory", str(tmp_path), "--config", f"grids_dir={REPO / 'grids'}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert any(ln.split() == ["fineweb", "1"] for ln in out.splitlines())
    msg = next(ln for ln in out.splitlines() if "rule fineweb" in ln)
    assert "CPU Slurm job, preset 'data'" in msg and "32 CPUs, 0 GPUs, 64 GB, 24:00 h" in msg
    assert "fineweb-edu-HuggingFaceTB--SmolLM-135M/train/manifest.json" in msg and "88.01B tokens" in msg


def test_hub_tokenizer_batch_encoding_matches_encode(tokenizer, dataset):
    """The hub path's batch call (fast backend) gives the ids of one-by-one encode."""
    from transformers import PreTrainedTokenizerFast

    from mor.data.tokenizer import TokenizerWrapper

    hf = TokenizerWrapper(PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), eos_token="<|endoftext|>"), "hf")
    docs = dataset[1][0][:50]
    assert hf.encode_batch(docs) == [hf.encode(d) for d in docs] == load_tokenizer(tokenizer).encode_batch(docs)


def _readme_source_block() -> str:
    """The `source:` line of the pre-downloaded-copy recipe, as the cluster manual prints it."""
    text = (REPO / "docs" / "cluster.md").read_text()
    return next(line for line in text.splitlines() if line.startswith("source: {path: /scratch/smollm-corpus"))


def test_readme_snapshot_recipe_reads_a_local_copy_of_the_hub_layout(tmp_path, data_root):
    """`hf download ... --include 'fineweb-edu-dedup/*' --local-dir X` writes X/fineweb-edu-dedup/*.parquet;
    the README's settings read that layout in file order, and the old `name: fineweb-edu-dedup`
    fails with an error that says what to write instead."""
    import yaml

    from mor.data.source import SourceError, SourceSpec, read_batches, resolve

    snap = tmp_path / "smollm-corpus"
    _, per_file = write_dataset(snap / "fineweb-edu-dedup", documents(data_root)[:300], 2)
    (snap / "cosmopedia-v2").mkdir()  # another subset of the repository, left out by data_files
    pq.write_table(pa.table({"text": ["not fineweb"]}), snap / "cosmopedia-v2" / "train-00000-of-00001.parquet")
    readme = yaml.safe_load(_readme_source_block().replace("/scratch/smollm-corpus", str(snap)))["source"]
    assert readme["name"] is None and "hf download" in (REPO / "docs" / "cluster.md").read_text()
    src = resolve(SourceSpec(**readme))
    assert [Path(f.split("::")[-1]).name for f in src.files] == ["train-00000-of-00002.parquet",
                                                                  "train-00001-of-00002.parquet"]
    first = next(read_batches(src, Position(0, 0, 0), 1, batch_docs=8))[1]
    assert first == per_file[0][:8]
    with pytest.raises(SourceError, match="set name: null and data_files: 'fineweb-edu-dedup/\\*.parquet'"):
        resolve(SourceSpec(path=str(snap), name="fineweb-edu-dedup"))
