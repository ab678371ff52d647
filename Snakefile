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


configfile: Path(workflow.basedir) / "workflows" / "config.yaml"


validate(config, "workflows/schemas/config.schema.yaml")


include: "workflows/common.smk"
include: "workflows/hub.smk"
include: "workflows/data.smk"
include: "workflows/train.smk"
include: "workflows/eval.smk"
include: "workflows/lm_eval.smk"
include: "workflows/analysis.smk"
include: "workflows/throughput.smk"
include: "workflows/report.smk"
include: "workflows/claims.smk"


rule all:
    input:
        ALL_ARTIFACTS,
    default_target: True
