#!/usr/bin/env bash
# The main job: set up, then the reduced-scale reproduction of Table 10 and Figure 6 on the
# embedded corpus (CPU). Extra arguments go to snakemake (e.g. -n for a dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/snakemake --profile local tables/table10 figures/fig6 "$@"
