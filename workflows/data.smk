# Data: the embedded corpus (Django docs from a pinned PyPI sdist), its BPE tokenizer and
# token arrays; or, in cluster mode, FineWeb-Edu streamed and tokenized once.


rule corpus:
    output:
        train=f"{DATA}/corpus/train.txt",
        val=f"{DATA}/corpus/val.txt",
        manifest=f"{DATA}/corpus/manifest.json",
    log:
        "logs/data/corpus.log",
    shell:
        "{PY}.data.corpus --out {DATA}/corpus --cache {DATA}/cache > {log} 2>&1"


rule tokenizer:
    input:
        f"{DATA}/corpus/train.txt",
    output:
        f"{DATA}/tokenizer/bpe-{{vocab}}.json",
    log:
        "logs/data/tokenizer-{vocab}.log",
    shell:
        "{PY}.data.tokenizer --train {input} --vocab-size {wildcards.vocab} --out {output} > {log} 2>&1"


rule tokens:
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
        "{PY}.data.tokens --text {input.text} --tokenizer {input.tokenizer} --out {output} > {log} 2>&1"


rule fineweb:
    output:
        train=f"{DATA}/tokens/fineweb-edu-{{slug}}/train.npy",
        val=f"{DATA}/tokens/fineweb-edu-{{slug}}/val.npy",
    params:
        tokenizer=hub_name,
        train_tokens=config.get("fineweb_train_tokens", 20_000_000_000),
        val_tokens=config.get("fineweb_val_tokens", 10_000_000),
    log:
        "logs/data/fineweb-{slug}.log",
    shell:
        "{PY}.data.fineweb --tokenizer {params.tokenizer} --out {DATA}/tokens/fineweb-edu-{wildcards.slug}"
        " --train-tokens {params.train_tokens} --val-tokens {params.val_tokens} > {log} 2>&1"
