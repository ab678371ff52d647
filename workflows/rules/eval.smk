# Score each trained run (validation NLL, router statistics, and the lmeval job's accuracies)
# into one parquet row, then merge a grid's rows. Editing a run's eval.* settings re-runs its eval job, not its training.


rule eval:
    localrule: LOCAL_LAUNCH  # a Slurm launcher runs through the mor-slurm executor
    input:
        # data: token files; lm_eval: runs/<grid>/<run_id>/lm_eval.json (workflows/rules/lm_eval.smk), if any task;
        # throughput: runs/<grid>/<run_id>/throughput.json (workflows/rules/throughput.smk), fig4a grids
        unpack(rule_inputs(data=run_data_inputs, lm_eval=lm_eval_result, throughput=throughput_result)),
        summary=layout.SUMMARY_PATTERN,
    output:
        KINDS["eval"].outputs[0],  # results/runs/{grid}/{run_id}.parquet
    params:
        mode=MODE,
        eval_settings=job_settings("eval"),  # an edit of eval.* re-runs this job alone
        schema=SCHEMA_VERSION,  # a new result schema (mor.results) regenerates every row, never a training
    threads: config["threads"]
    resources:
        **job_resources("eval"),  # the Slurm preset's GPUs, memory, time (common.smk)
    log:
        layout.run_log_pattern("eval"),
    shell:
        "{PY}.launch eval --grid {GRIDS_DIR:q}/{wildcards.grid}.yaml --run-id {wildcards.run_id} --mode {params.mode}"
        " --run-dir \"$(dirname {input.summary:q})\" --data-root {DATA:q} --threads {threads} --out {output:q} {LAUNCH_ARGS}"
        " > {log:q} 2>&1"


rule collect:
    localrule: True
    input:
        grid_run_results,
    output:
        layout.GRID_RESULTS_PATTERN,
    log:
        layout.grid_log_pattern("collect"),
    shell:
        "{PY} collect --grid {wildcards.grid} --out {output:q} {input:q} > {log:q} 2>&1"
