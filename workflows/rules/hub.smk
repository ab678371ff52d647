# The one job that reaches the Hugging Face hub (mor.lm_eval.hub_cache): it fills the shared
# cache (HF_HOME) with the grids' hub tokenizers and the datasets of their lm-eval tasks that
# are not our offline copies (mor_*), on the node the workflow runs on (localrule: the login
# or transfer node), before any job that needs them. Every other job runs with the hub and
# `datasets` offline (mor.jobs.JobKind.environment) and reads that cache only. The local
# profile uses no hub tokenizer and only offline tasks, so it never runs this rule. What it
# fetches (HUB_TOKENIZERS, HUB_TASKS) and who waits for it (hub_cache_inputs): common.smk.


rule hub_cache:
    output:
        HUB_MANIFEST,
    params:
        tokenizers=HUB_TOKENIZERS,  # a new tokenizer or task fetches again (already cached files are not re-downloaded)
        tasks=HUB_TASKS,
    localrule: True
    log:
        "logs/data/hub_cache.log",
    shell:
        "{PY}.launch hub --out {output:q}"
        + "".join(f" --tokenizer '{t}'" for t in HUB_TOKENIZERS)
        + "".join(f" --task '{t}'" for t in HUB_TASKS)
        + " > {log:q} 2>&1"
