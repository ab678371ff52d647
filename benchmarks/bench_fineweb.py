"""FineWeb-Edu preparation speed and memory on this machine, projected to 20 B tokens.

    .venv/bin/python benchmarks/bench_fineweb.py [--workers N] [--tokens 8000000] [--tokenizer PATH]

Runs the real preparation (``python -m mor.launch data``, worker processes, shards) on a
local parquet dataset built from the embedded corpus (repeated to the token count) and
prints tokens/s per core, the peak RSS of the main process and of the largest worker, and
the CPU-hours that 20 B tokens would take at that rate. Each run is a fresh process, so the
RSS is what the OS measured for it. The rate with the local 4096-entry BPE is an upper
bound for the 49152-entry SmolLM tokenizer; measure with ``--tokenizer`` pointing at its
``tokenizer.json`` where it can be downloaded, and put the figure in slurm/presets.yaml
(``data.tokens_per_s_per_cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))  # the helpers package
sys.path.insert(0, str(REPO / "tests" / "workflow"))

PAPER_TOKENS = 20e9


def run(settings: Path, out: Path, tokenizer: str, workers: int, tmp: Path) -> dict:
    code = ("import json, resource, sys, time; from mor.data.fineweb import load_settings, prepare; "
            "s = prepare(load_settings(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), log=lambda *_: None); "
            "print('RESULT', json.dumps(s))")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HOME=str(tmp / "hf-home"))
    proc = subprocess.run([sys.executable, "-c", code, str(settings), tokenizer, str(out), str(workers)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.split("RESULT", 1)[1])


def main() -> None:
    from helpers.tiny import ensure_data
    from test_fineweb import documents, write_dataset, write_settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=8_000_000, help="train tokens to prepare")
    ap.add_argument("--tokenizer", default=None, help="tokenizer .json (default: the local BPE-4096)")
    a = ap.parse_args()
    data = ensure_data()
    tokenizer = a.tokenizer or str(data / "tokenizer" / "bpe-4096.json")
    docs = documents(data)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src, _ = write_dataset(tmp / "src", docs * (a.tokens // 600_000 + 2), 8)
        print(f"dataset: {len(docs) * (a.tokens // 600_000 + 2):,} documents in 8 parquet files; tokenizer {tokenizer}")
        print(f"{'workers':>7} {'tokens':>10} {'s':>7} {'tok/s':>10} {'tok/s/core':>10} {'main RSS':>9} "
              f"{'worker RSS':>10} {'CPU-h for 20B':>13}")
        for w in a.workers:
            settings = write_settings(tmp / f"s{w}.yaml", src, train=a.tokens, val=100_000, shard=1_000_000)
            r = run(settings, tmp / f"out{w}", tokenizer, w, tmp)
            total = r["train_tokens"] + r["val_tokens"]
            rate = total / r["seconds"]
            per_core = rate / w
            print(f"{w:>7} {total:>10,} {r['seconds']:>7.1f} {rate:>10,.0f} {per_core:>10,.0f} "
                  f"{r['peak_rss_mib']:>7.0f}Mi {r['peak_worker_rss_mib']:>8.0f}Mi {PAPER_TOKENS / per_core / 3600:>13.1f}")
    print("CPU-h = 20e9 / (tok/s per core) / 3600; wall hours on a data job = CPU-h / its cpus_per_task.\n"
          "The seconds include starting the workers and reading the dataset, so small runs understate the rate.\n"
          "Worker RSS (RUSAGE_CHILDREN) starts from the parent's RSS at spawn (fork before exec), so it is an upper bound.")


if __name__ == "__main__":
    main()
