"""The eval job kind's settings hook (``mor.jobs``), apart from ``mor.eval.job``: Snakemake
calls it for every run while it builds the DAG (the eval rule's params), and ``mor.eval.job``
imports torch, which a dry run or a status query should not pay for."""

from __future__ import annotations


def job_settings(run, mode: str, wildcards: dict) -> dict:
    """What decides the row besides the weights: the run's eval.* settings (the rule's params)."""
    return run.eval_dict()
