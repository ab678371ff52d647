"""Rehearse a grid's cluster jobs on fake tensors before any GPU hour is spent (docs/rehearsal.md).

Each job runs through the function the Slurm job runs (``mor.jobs.KINDS``) at the real shapes
under torch's ``FakeTensorMode``: every shape, dtype, device and allocation is real, nothing is
computed. ``mor.rehearsal.fake`` holds the mode and what it has to stand in for (CUDA queries, a
scalar read), ``mor.rehearsal.data`` the synthetic token files, ``mor.rehearsal.measure`` the
memory trackers, ``mor.rehearsal.jobs`` one rehearsal per job kind, ``mor.rehearsal.table`` the
table. ``python -m mor.rehearsal --grid grids/table10.yaml`` runs it (with the rehearsal venv's
python for fake CUDA: ``scripts/setup_rehearsal.sh``).
"""
