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
    localrule: True
    output:
        str(REHEARSAL_VENV / ".mor-installed"),
    params:
        script=str(Path(workflow.basedir) / "scripts" / "setup_rehearsal.sh"),
    log:
        "logs/rehearsal/env.log",
    shell:
        "bash {params.script:q} > {log:q} 2>&1"


rule rehearsal_table:
    localrule: True
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
        # the table is kept when a job failed (it names it); the target rule below then fails
        "{params.python:q} -m mor.rehearsal --grid {input.grid:q} --mode cluster --presets {params.presets:q}"
        " --out rehearsal/{wildcards.grid} --exit-zero > {log:q} 2>&1"


rule rehearsal_grid:
    localrule: True
    input:
        csv=rules.rehearsal_table.output.csv,
    output:
        "rehearsal/{grid}",  # a marker: every job of the grid passed
    log:
        "logs/rehearsal/{grid}.done.log",
    wildcard_constraints:
        grid=r"(?!paper$)[A-Za-z0-9_-]+",
    shell:
        "{PY}.rehearsal.table {input.csv:q} > {log:q} 2>&1 && touch {output:q}"


rule rehearsal_paper:
    localrule: True
    input:
        expand("rehearsal/{grid}", grid=REHEARSAL_GRIDS),
    output:
        touch("rehearsal/paper"),
    log:
        "logs/rehearsal/paper.log",
