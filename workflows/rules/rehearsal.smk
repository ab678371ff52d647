# Rehearse a grid's cluster jobs on fake tensors before submitting (docs/rehearsal.md):
#   snakemake rehearsal/table10     -> rehearsal/table10.md and .csv
#   snakemake rehearsal/paper       -> the same for every grid with a cluster mode
# The rehearsal runs in its own venv (.venv-rehearsal: the GPU image's CUDA build of torch),
# made by scripts/setup_rehearsal.sh on first use. Nothing here is submitted to Slurm.
import yaml as _yaml

REHEARSAL_VENV = Path(workflow.basedir) / ".venv-rehearsal"
REHEARSAL_GRIDS = sorted(p.stem for p in all_grids(GRIDS_DIR)
                         if "cluster" in ((_yaml.safe_load(p.read_text()) or {}).get("modes") or {}))


rule rehearsal_env:
    output:
        str(REHEARSAL_VENV / ".mor-installed"),
    log:
        "logs/rehearsal/env.log",
    shell:
        "bash {workflow.basedir}/scripts/setup_rehearsal.sh > {log:q} 2>&1"


rule rehearsal_table:
    input:
        grid=str(GRIDS_DIR / "{grid}.yaml"),
        env=rules.rehearsal_env.output,
    output:
        csv="rehearsal/{grid}.csv",
        md="rehearsal/{grid}.md",
    params:
        presets=str(PRESETS),
        python=str(REHEARSAL_VENV / "bin" / "python"),
    log:
        "logs/rehearsal/{grid}.log",
    wildcard_constraints:
        grid=r"[A-Za-z0-9_-]+",
    shell:
        # exit status 1 = a job failed: the table is written and names it; the target stays failed
        "{params.python:q} -m mor.rehearsal --grid {input.grid:q} --mode cluster --presets {params.presets:q}"
        " --out rehearsal/{wildcards.grid} > {log:q} 2>&1"


rule rehearsal_grid:
    input:
        rules.rehearsal_table.output,
    output:
        touch("rehearsal/{grid}"),
    log:
        "logs/rehearsal/{grid}.done.log",
    wildcard_constraints:
        grid=r"(?!paper$)[A-Za-z0-9_-]+",


rule rehearsal_paper:
    input:
        expand("rehearsal/{grid}.md", grid=REHEARSAL_GRIDS),
    output:
        touch("rehearsal/paper"),
    log:
        "logs/rehearsal/paper.log",
