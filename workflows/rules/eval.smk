# Score each trained run (validation NLL, router statistics, and the lmeval job's accuracies)
# once per distinct eval settings into the run's own measurement, runs/<run_id>/eval/<eval_hash>.parquet
# (grids that list the run with the same eval.* settings share it; issue 58). Each grid's row of
# the run copies it under the grid's name, label and config (rule row, mor.eval.row), and the
# grid's rows merge into results/<grid>.parquet (rule collect). Editing a run's eval.* settings in
# a grid gives that grid's row another measurement (a new eval job), not a new training.


rule eval:
    localrule: LOCAL_LAUNCH  # a Slurm launcher runs through the mor-slurm executor
    input:
        # data: token files; lm_eval: runs/<run_id>/lm_eval.json (workflows/rules/lm_eval.smk), if any task
        unpack(rule_inputs(data=run_data_inputs, lm_eval=lm_eval_result)),
        summary=layout.SUMMARY_PATTERN,
    output:
        KINDS["eval"].outputs[0],  # runs/{run_id}/eval/{eval_hash}.parquet
    params:
        mode=MODE,
        eval_settings=job_settings("eval"),  # the settings of its hash (a listing that has them)
        schema=SCHEMA_VERSION,  # a new result schema (mor.results) regenerates every measurement, never a training
    threads: config["threads"]
    resources:
        **job_resources("eval"),  # the Slurm preset's GPUs, memory, time (common.smk)
    log:
        layout.run_log_pattern("eval-{eval_hash}"),
    shell:
        "{PY}.launch eval --grid {GRIDS_DIR:q} --eval-settings {wildcards.eval_hash} --run-id {wildcards.run_id}"
        " --mode {params.mode} --run-dir \"$(dirname {input.summary:q})\" --data-root {DATA:q} --threads {threads}"
        " --out {output:q} {LAUNCH_ARGS} > {log:q} 2>&1"


rule row:
    localrule: True  # copies a measurement under the grid's name: a process start, never a Slurm job
    input:
        # throughput: runs/<run_id>/throughput.json (workflows/rules/throughput.smk), fig4a grids
        unpack(rule_inputs(throughput=throughput_result)),
        measurement=eval_measurement,
        summary=layout.SUMMARY_PATTERN,
    output:
        layout.ROW_PATTERN,  # results/runs/{grid}/{run_id}.parquet: the grid's row of the run
    params:
        mode=MODE,
        schema=SCHEMA_VERSION,
    log:
        layout.run_log_pattern("row"),
    shell:
        "{PY} row --grid {GRIDS_DIR:q}/{wildcards.grid}.yaml --run-id {wildcards.run_id} --mode {params.mode}"
        " --run-dir \"$(dirname {input.summary:q})\" --out {output:q} > {log:q} 2>&1"


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
