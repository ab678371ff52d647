# Tables and figures, redrawn from a grid's parquet alone; the claims table; the `paper`
# target. Every artifact is flagged for Snakemake's report (`--report report.html`), under
# its paper section, with a caption (workflows/report/artifact.rst -> mor.reports.captions).
# The report opens on the results (mor.reports.landing): workflow.rst's landing text, the claims
# and the training curves first in the menu, the DAG one click away under Workflow.
from functools import partial

from mor.reports.captions import Captions, section  # section: the claims rule (claims.smk)
from mor.reports.landing import CURVES_CATEGORY, landing_rst


report: "../report/workflow.rst"


# read when the report is rendered (claims verdicts, run counts, commits): never a param
config["mor_captions"] = Captions(ARTIFACT_GRID, grids_dir=GRIDS_DIR)
# workflow.rst passes the category names and the files shown (the counts are of those: mor.reports.landing)
config["mor_landing"] = partial(landing_rst, artifact_grid=ARTIFACT_GRID)
CAPTION = "../report/artifact.rst"
config["mor_curve_caption"] = curves_caption  # (common.smk)


rule table:
    localrule: True
    input:
        unpack(artifact_results("tables")),  # results: the grid's parquet; rows: each of its runs' rows (common.smk)
        grid=artifact_grid_file("tables"),
        analyses=artifact_analyses("tables"),  # analysis files (workflows/rules/analysis.smk), tokenizer, if any
        curves=artifact_curves("tables"),  # the grid's training curves (rule curves) come with it
    output:
        report(directory("tables/{name}"), patterns=["{file}.html"], caption=CAPTION,
               category=artifact_section("tables"), subcategory="tables/{name}"),
    params:
        mode=MODE,
        tags=" ".join(shlex.quote(t) for t in TAGS),  # the drawing step checks the runs under them
        runs=artifact_run_list("tables"),  # the run list it is drawn from: a changed list redraws it
    log:
        "logs/report/tables-{name}.log",
    wildcard_constraints:
        name=r"(?!claims$)[A-Za-z0-9_-]+",  # tables/claims is rule claims
    shell:
        "{PY} report --artifact tables/{wildcards.name} --results {input.results:q} --grid {input.grid:q}"
        " --mode {params.mode} --tags {params.tags} --data-root {DATA:q} > {log:q} 2>&1"


rule figure:
    localrule: True
    input:
        unpack(artifact_results("figures")),  # results: the grid's parquet; rows: each of its runs' rows (common.smk)
        grid=artifact_grid_file("figures"),
        analyses=artifact_analyses("figures"),  # analysis files (workflows/rules/analysis.smk), tokenizer, if any
        curves=artifact_curves("figures"),  # the grid's training curves (rule curves) come with it
    output:
        report(directory("figures/{name}"), patterns=["{file}.png"], caption=CAPTION,
               category=artifact_section("figures"), subcategory="figures/{name}"),
    params:
        mode=MODE,
        tags=" ".join(shlex.quote(t) for t in TAGS),  # the drawing step checks the runs under them
        runs=artifact_run_list("figures"),  # the run list it is drawn from: a changed list redraws it
    log:
        "logs/report/figures-{name}.log",
    shell:
        "{PY} report --artifact figures/{wildcards.name} --results {input.results:q} --grid {input.grid:q}"
        " --mode {params.mode} --tags {params.tags} --data-root {DATA:q} > {log:q} 2>&1"


# Training loss (and MoR router loss) against tokens for every run of a grid, from the train
# logs (mor.reports.curves); listed in the report's second section (after the claims), one
# entry per grid.
rule curves:
    localrule: True
    input:
        results=layout.GRID_RESULTS_PATTERN,
    output:
        report(directory("figures/curves/{grid}"), patterns=["{file}.png"], caption="../report/curves.rst",
               category=CURVES_CATEGORY, subcategory="figures/curves/{grid}"),
    log:
        "logs/report/curves-{grid}.log",
    shell:
        "{PY}.reports.curves --grid {wildcards.grid} --results {input.results:q} --runs runs --out {output:q} > {log:q} 2>&1"


# Every table and figure of the paper for the active profile, and the claims checked on them.
rule paper:
    localrule: True
    input:
        ALL_ARTIFACTS,
        "tables/claims",
