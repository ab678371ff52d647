#!/usr/bin/env bash
# Create .venv-rehearsal from locks/rehearsal.txt: the GPU image's torch (2.11.0, the default PyPI
# linux wheel, which is the CUDA build with its nvidia-* wheels) beside .venv's CPU torch, never
# mixed into it, with pyproject.toml's other pins and pytest, every distribution with its sha256,
# installed with no resolver step; then the project itself, editable. `mor.rehearsal` runs in it
# (docs/rehearsal.md). Idempotent: a stamp of the dependency files skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MOR_REHEARSAL_VENV:-.venv-rehearsal}
TORCH="torch==2.11.0"  # the version of the cluster's GPU image (slurm/, docs/cluster.md); locks/rehearsal.in
LOCK=locks/rehearsal.txt
source scripts/python.sh
grep -q "^$TORCH " "$LOCK" || { echo "setup_rehearsal: $LOCK does not pin $TORCH: re-lock (bash locks/compile.sh)" >&2; exit 1; }
stamp=$VENV/.mor-installed
want=$( (cat pyproject.toml "$0" "$LOCK") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  export PIP_CACHE_DIR=${PIP_CACHE_DIR:-/tmp/pipcache-rehearsal}
  # The machine-wide pip constraint (if any) caps torch, and its extra indexes may hold other
  # builds of it: this venv installs exactly the lock, from PyPI (the hashes reject any other file).
  export PIP_CONSTRAINT=
  "$VENV/bin/python" -m pip install --quiet --index-url https://pypi.org/simple --require-hashes --no-deps -r "$LOCK"
  "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
echo "setup_rehearsal: $VENV ready ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "cuda build", torch.version.cuda)'), $(du -sh "$VENV" | cut -f1))"
