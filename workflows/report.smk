# Tables and figures, redrawn from a grid's parquet alone.


rule table:
    input:
        results=artifact_results("tables"),
        grid=artifact_grid_file("tables"),
        analyses=artifact_analyses("tables"),  # analysis files (workflows/analysis.smk), tokenizer, if any
    output:
        directory("tables/{name}"),
    params:
        mode=MODE,
    log:
        "logs/report/tables-{name}.log",
    shell:
        "{PY} report --artifact tables/{wildcards.name} --results {input.results} --grid {input.grid}"
        " --mode {params.mode} --data-root {DATA} > {log} 2>&1"


rule figure:
    input:
        results=artifact_results("figures"),
        grid=artifact_grid_file("figures"),
        analyses=artifact_analyses("figures"),  # analysis files (workflows/analysis.smk), tokenizer, if any
    output:
        directory("figures/{name}"),
    params:
        mode=MODE,
    log:
        "logs/report/figures-{name}.log",
    shell:
        "{PY} report --artifact figures/{wildcards.name} --results {input.results} --grid {input.grid}"
        " --mode {params.mode} --data-root {DATA} > {log} 2>&1"
