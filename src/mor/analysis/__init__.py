"""Analyses of trained runs for the paper's figures (pure functions, no files):

    depth_cap     NLL with the maximum recursion depth capped at 1..Nr (Fig. 5c, § 5.3)
    kv_states     per-depth key/value magnitude and pairwise cosine similarity (Figs. 7-8, App. H.1)
    token_depths  tokens grouped by the recursion depth they receive (Table 17, Fig. 1 right)
    router_hist   router output histograms as bars, selected vs unselected (Fig. 5b)

``mor.analysis.job`` measures the model-dependent ones once per run (the ``analysis`` job)
and stores them beside the run's parquet: ``results/runs/<run_id>.<analysis>.npz``
(format and applicability in ``mor.analysis.sidecar``, which the reports read).

Layer: domain (imports model, data, train's model loader; never the launcher).
"""
