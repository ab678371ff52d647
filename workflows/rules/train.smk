# One job per run id, however many grids list it: train (or resume from the last checkpoint) -> runs/<run_id>/.
# A run that imports the authors' checkpoint (model.import_checkpoint) is imported instead, nothing
# trained (mor.launch runs mor.jobs.KINDS['import'] for it, in this process; issue 62).


rule train:
    localrule: LOCAL_LAUNCH  # a Slurm launcher runs through the mor-slurm executor
    input:
        # token files; an up-training run's source; a decay branch's stable run
        unpack(rule_inputs(data=run_data_inputs, init=init_checkpoint_inputs, branch=branch_source_inputs)),
    output:
        summary=KINDS["train"].outputs[0],  # runs/{run_id}/train_summary.json
    params:
        mode=MODE,
    threads: config["threads"]
    resources:
        **job_resources("train"),  # the Slurm preset's GPUs, memory, time (common.smk)
    log:
        layout.run_log_pattern("train"),
    # --grid a folder: the launcher reads the run's home listing (mor.listings), as run_config does
    shell:
        "{PY}.launch train --grid {GRIDS_DIR:q} --run-id {wildcards.run_id} --mode {params.mode}"
        " --run-dir \"$(dirname {output.summary:q})\" --data-root {DATA:q} --threads {threads} {LAUNCH_ARGS} > {log:q} 2>&1"
