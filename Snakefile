# mor-repro: YAML grids -> train / eval jobs -> parquet -> tables and figures.
#
#   snakemake --profile local tables/table10 figures/fig6     # this machine, CPU scales
#   snakemake --profile slurm tables/table10                  # a Slurm cluster, paper scales
#
# Every grid under grids/ is validated when this file is parsed, so a bad grid fails
# before any job starts. See README.md for the layout.
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: Path(workflow.basedir) / "workflows" / "config" / "config.yaml"


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


rule all:
    input:
        ALL_ARTIFACTS,
    default_target: True
