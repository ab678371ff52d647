"""Validation scoring (layer: domain; imports model, data, metrics and its sibling jobs' readers).

``nll`` (teacher-forced and causal-routing NLL, router statistics) and ``job`` (the ``eval``
job kind, which writes a run's parquet row from its own scores and the lmeval and throughput
jobs' files).
"""
