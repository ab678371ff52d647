"""mor-repro: Mixture-of-Recursions, reproduced from YAML grids to tables, figures and claims.

The layers, each importing only the ones above it in this list (``tests/unit/test_import_layers.py``
holds them against the code; ``python tests/helpers/import_graph.py`` prints the package graph):

    config, grids, results, atomic, ...          torch-free foundations (run configs, the grid
                                                 expansion, the parquet schema, atomic writes)
    model, data, metrics, flops                  the network, the corpus and tokenizer, pure
                                                 metrics, pure FLOPs/memory (the model's tying plan)
    train, eval, engine, lm_eval, analysis       domain work; each package owns its job function
                                                 (``*/job.py``: paths in, files out, no cluster)
    jobs                                         the one table of job kinds (``mor.jobs.KINDS``)
    launch                                       run a kind inline or on Slurm (submitit), the plan
    cli                                          ``python -m mor``: the user-facing verbs

Beside them, reports and claims read parquet and pure functions only: never a job, the
trainer or the launcher.
"""
