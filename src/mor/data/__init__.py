"""Corpus, tokenizer and token files (layer: data; imports config and the foundations only).

The local corpus and BPE (``corpus``, ``tokenizer``, ``tokens``), the sampler the trainer
reads, and the cluster's FineWeb-Edu preparation (``fineweb``, the ``data`` job kind).
"""
