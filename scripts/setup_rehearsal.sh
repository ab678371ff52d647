#!/usr/bin/env bash
# Create .venv-rehearsal: the GPU image's torch (2.11.0, the default PyPI linux wheel, which is
# the CUDA build with its nvidia-* wheels) beside .venv's CPU torch, never mixed into it, with
# the project installed editable and its other pinned dependencies. `mor.rehearsal` runs in it
# (docs/rehearsal.md). Idempotent: a stamp of the dependency files skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MOR_REHEARSAL_VENV:-.venv-rehearsal}
TORCH="torch==2.11.0"  # the version of the cluster's GPU image (slurm/, docs/cluster.md)
source scripts/python.sh
stamp=$VENV/.mor-installed
want=$( (cat pyproject.toml "$0"; echo "$TORCH") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  export PIP_CACHE_DIR=${PIP_CACHE_DIR:-/tmp/pipcache-rehearsal}
  # The machine-wide pip constraint (if any) caps torch; this venv asks for one exact version,
  # so only the project's own pins apply here. torch first, alone, so that no dependency can
  # swap it for another build.
  export PIP_CONSTRAINT=
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet --index-url https://pypi.org/simple "$TORCH"
  # The project's dependencies less torch (pinned in pyproject.toml), then the project itself.
  "$VENV/bin/python" - > "$VENV/requirements.txt" <<'PYEOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.replace(" ", "").startswith("torch=")))
PYEOF
  echo "$TORCH" > "$VENV/constraints.txt"
  "$VENV/bin/python" -m pip install --quiet -c "$VENV/constraints.txt" -r "$VENV/requirements.txt" "pytest==9.2.0"
  "$VENV/bin/python" -m pip install --quiet --no-deps -e .
  echo "$want" > "$stamp"
fi
echo "setup_rehearsal: $VENV ready ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "cuda build", torch.version.cuda)'), $(du -sh "$VENV" | cut -f1))"
