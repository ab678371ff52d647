# Sourced by the set-up scripts (setup.sh, setup_rehearsal.sh): sets PY to a Python >= 3.11,
# the first of python3.11 ... python3 on PATH, or $PYTHON where it is set.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.11 python3.12 python3.13 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "$(basename "$0"): need Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
