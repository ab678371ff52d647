# mor-repro: YAML grids -> train / eval jobs -> parquet -> tables and figures.
#
#   snakemake --profile local tables/table10 figures/fig6     # this machine, CPU scales
#   snakemake --profile slurm tables/table10                  # a Slurm cluster, paper scales
#
# Every grid under grids/ is validated when this file is parsed, so a bad grid fails
# before any job starts. See README.md for the layout.
import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # works without `pip install -e .`

from mor.workflow_config import check_config, checked
from mor.workflow_guard import clear_stale_locks

# A workflow killed hard (SIGKILL, a rebooted login node) leaves Snakemake's lock files
# behind; they are removed here, before Snakemake looks for them, when no other workflow is
# alive in this directory, so the same command simply runs again (see mor.workflow_guard).
clear_stale_locks()


configfile: Path(workflow.basedir) / "workflows" / "config" / "config.yaml"


# Errors in the config, a grid or a target are one line naming the file (mor.workflow_config).
checked(check_config, config, Path(workflow.basedir) / "workflows" / "schemas" / "config.schema.yaml")
validate(config, "workflows/schemas/config.schema.yaml")


include: "workflows/rules/common.smk"
include: "workflows/rules/hub.smk"
include: "workflows/rules/data.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/eval.smk"
include: "workflows/rules/lm_eval.smk"
include: "workflows/rules/analysis.smk"
include: "workflows/rules/throughput.smk"
include: "workflows/rules/report.smk"
include: "workflows/rules/claims.smk"
include: "workflows/rules/rehearsal.smk"


rule all:
    input:
        ALL_ARTIFACTS,
    default_target: True
