"""Validation scoring (layer: domain; imports model, data, metrics and its sibling jobs' readers).

``nll`` (teacher-forced and causal-routing NLL, router statistics), ``job`` (the ``eval``
job kind, which writes a run's measurement from its own scores and the lmeval job's file, once
per eval settings) and ``row`` (a grid's result row of the run: the measurement with the grid's
label and config and the throughput job's file; no torch).
"""
