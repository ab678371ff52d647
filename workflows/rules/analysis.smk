# Measurements of trained runs that some figures need beyond the result row (mor.analysis.job):
#   analysis   one job per (run, analysis) -> results/runs/<run_id>.<analysis>.npz, beside
#              the run's parquet. depth_cap: NLL with the recursion depth capped at 1..Nr (Fig. 5c);
#              kv: per-depth key/value magnitude and cosine similarity (Figs. 7, 8). Only the runs
#              of a grid that lists such a figure get one (mor.analysis.sidecar.ARTIFACT_ANALYSES); the
#              figure rule waits for them. It reads the final weights and never retrains; its params
#              are its own settings (from eval.*) and the analysis code's VERSION.
from mor.analysis.sidecar import ANALYSES, VERSION as ANALYSIS_VERSION


rule analysis:
    localrule: LOCAL_LAUNCH  # a Slurm launcher runs through the mor-slurm executor
    input:
        summary=layout.SUMMARY_PATTERN,
        data=run_data_inputs,
    output:
        KINDS["analysis"].outputs[0],  # results/runs/{run_id}.{analysis}.npz
    wildcard_constraints:
        analysis="|".join(ANALYSES),
    params:
        mode=MODE,
        settings=job_settings("analysis"),  # an edit of the eval.* settings it uses re-runs it
        version=ANALYSIS_VERSION,
    threads: config["threads"]
    resources:
        **job_resources("analysis"),  # the Slurm preset's GPUs, memory, time (common.smk)
    log:
        layout.run_log_pattern("analysis-{analysis}"),
    shell:
        "{PY}.launch analysis --analysis {wildcards.analysis} --grid {GRIDS_DIR:q}"
        " --run-id {wildcards.run_id} --mode {params.mode} --run-dir \"$(dirname {input.summary:q})\" --data-root {DATA:q}"
        " --threads {threads} --out {output:q} {LAUNCH_ARGS} > {log:q} 2>&1"
