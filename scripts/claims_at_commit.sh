#!/usr/bin/env bash
# Decide the claims with the claims code (and its pre-registered design, grids/claims/claims.yaml)
# as it was at COMMIT, on a results folder, without touching this checkout: the "before" of a
# re-decision on the same runs (e.g. 2f83429, before issues 47 and 48 changed the verdicts).
#
#   scripts/claims_at_commit.sh COMMIT OUT [python -m mor claims arguments]
#   scripts/claims_at_commit.sh 2f83429 /tmp/claims_before \
#       --results RESULTS/claims/round1 --analyses RESULTS --round RESULTS/claims/round0/plan.json \
#       --round RESULTS/claims/round1/plan.json --mode local
#
# COMMIT's tree is checked out once as a detached git worktree, /tmp/claims_at_<commit> (or
# $CLAIMS_WORKTREE), and its `python -m mor claims` runs with PYTHONPATH at that tree's src/
# (python -P: the working folder is not searched first), so the checkout's own src/ is never
# imported (checked before it runs). The interpreter is this checkout's .venv (or $PYTHON): the
# results schema and the dependencies must be ones COMMIT's code reads. Relative paths are read
# from the folder this is run in. The worktree stays for the next call; remove it with
# `git worktree remove /tmp/claims_at_<commit>`. Pass no --spec to use COMMIT's own design.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse --verify --quiet "$1^{commit}") || { echo "$(basename "$0"): no commit $1" >&2; exit 2; }
out=$2
shift 2
wt=${CLAIMS_WORKTREE:-/tmp/claims_at_${commit:0:7}}
if [ ! -e "$wt/.git" ]; then
  git -C "$repo" worktree add --detach "$wt" "$commit" >&2
fi
if [ "$(git -C "$wt" rev-parse HEAD)" != "$commit" ]; then
  echo "$(basename "$0"): $wt holds $(git -C "$wt" rev-parse --short HEAD), not ${commit:0:7}" >&2
  exit 1
fi
py=${PYTHON:-$repo/.venv/bin/python}
got=$(PYTHONPATH="$wt/src" "$py" -P -c 'import mor; print(mor.__file__)')
case "$got" in
  "$wt"/src/*) ;;
  *) echo "$(basename "$0"): mor imports from $got, not from $wt/src" >&2; exit 1 ;;
esac
echo "claims at ${commit:0:12} ($wt) -> $out" >&2
PYTHONPATH="$wt/src" exec "$py" -P -m mor claims "$@" --out "$out"
