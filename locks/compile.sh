#!/usr/bin/env bash
# Re-lock: rewrite locks/cpu.txt (this machine, CI), locks/cuda.txt (the cluster's GPU nodes) and
# locks/rehearsal.txt (.venv-rehearsal, scripts/setup_rehearsal.sh)
# from pyproject.toml and the locks/*.in files, with a sha256 for every distribution. Run after
# changing a pin; an existing lock's versions are kept where the pins still allow them (uv
# prefers the output file's versions), so a re-lock moves only what the change needs.
# Needs uv (e.g. python3 -m venv /tmp/uv && /tmp/uv/bin/pip install uv; UV=/tmp/uv/bin/uv).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
common=(--generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 --quiet)
nodeps=$(mktemp); trap 'rm -f "$nodeps"' EXIT
"$UV" pip compile "${common[@]}" --no-deps --no-header locks/nodeps.in -o "$nodeps"
lock() {  # lock <output> <pip-compile arguments...>: the resolved set, then the no-deps wheels
  local out=$1; shift
  "$UV" pip compile "${common[@]}" --custom-compile-command "bash locks/compile.sh" "$@" -o "$out"
  { echo "# --no-deps wheels (locks/nodeps.in), installed from this file like the rest"; cat "$nodeps"; } >> "$out"
}
# torch's CPU build lives on PyTorch's CPU index, not PyPI (a local wheelhouse works too: MOR_TORCH_INDEX)
lock locks/cpu.txt pyproject.toml locks/cpu.in --extra test \
  --find-links "${MOR_TORCH_INDEX:-https://download.pytorch.org/whl/cpu/torch/}"
lock locks/cuda.txt pyproject.toml locks/cuda.in --extra cluster
# the rehearsal's venv: pyproject's pins with torch overridden by the GPU image's (no data wheels)
"$UV" pip compile "${common[@]}" --custom-compile-command "bash locks/compile.sh" pyproject.toml locks/rehearsal.in \
  --override locks/rehearsal-override.txt -o locks/rehearsal.txt
