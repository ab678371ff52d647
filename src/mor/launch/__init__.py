"""Running job kinds (layer: launch; may import everything below, nothing imports it but the CLI).

``__main__`` (``python -m mor.launch``: any kind of ``mor.jobs.KINDS`` inline or on Slurm, and
the plan), ``checkpointable`` (the one submitit wrapper), ``slurm`` (presets, submission and
waiting), ``distributed`` (the process group from Slurm's task variables), ``plan``.
"""
