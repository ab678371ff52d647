# Decoding throughput (App. E, mor.engine.job): one job per trained run of a grid that draws
# fig4a (mor.throughput_protocol.ARTIFACTS) -> runs/<run_id>/throughput.json, which the row rule
# copies into the run's result row of each such grid. It reads the final weights and never retrains; its params
# are the protocol of the mode (workflows/config/throughput.yaml) and the job's VERSION. On Slurm it
# takes the preset's `throughput` resources (one GPU).
from mor.throughput_protocol import VERSION as THROUGHPUT_VERSION


rule throughput:
    localrule: LOCAL_LAUNCH  # a Slurm launcher runs through the mor-slurm executor
    input:
        summary=layout.SUMMARY_PATTERN,
        data=run_data_inputs,
    output:
        KINDS["throughput"].outputs[0],  # runs/{run_id}/throughput.json
    params:
        mode=MODE,
        protocol=job_settings("throughput"),  # an edit of this mode's protocol re-runs it (and the rows that read it)
        version=THROUGHPUT_VERSION,
        torch_threads=config["threads"],  # the timing's torch threads; `threads` may be raised to reserve cores
    threads: config["threads"]
    resources:
        **job_resources("throughput"),  # the Slurm preset's GPUs, memory, time (common.smk)
    log:
        layout.run_log_pattern("throughput"),
    shell:
        "{PY}.launch throughput --grid {GRIDS_DIR:q} --run-id {wildcards.run_id}"
        " --mode {params.mode} --run-dir \"$(dirname {input.summary:q})\" --data-root {DATA:q} --threads {params.torch_threads}"
        " --out {output:q} {LAUNCH_ARGS} > {log:q} 2>&1"
