"""What the tests share, in one package (importable as ``helpers``: pyproject's pytest
``pythonpath`` puts tests/ on the path). Test files import from here, never from one another
or from conftest.py; conftest.py holds only hooks and fixtures.

paths        the repository's folders (REPO, SRC)
tiny         the embedded corpus's data files and tiny configs and result rows
figures      what a drawn figure shows (PNG size, bar heights)
procs        processes: /proc readers, a command in its own process group
deadlines    hang bounds scaled by a per-session machine factor
workflow     Snakemake through the local profile, the end-to-end test grids
launch       a single-process reference for data parallelism, fake rank environments
checkpoint   the crash-safety harness: a tiny trainer, a killed partial run, bit-for-bit comparison
decode       the decoding variants and a tiny model whose routing really splits tokens
slurm_fakes  fake sacct / squeue / sbatch / scancel / srun on PATH (no Slurm needed)
slurm_jobs   launcher commands and Slurm queries against the loopback cluster
slurm_cluster  starting and releasing the loopback Slurm cluster
browser      headless Chromium over the DevTools protocol (also a script: --install)
report_page  the report grid and the page queries the browser tests click through
chaos        kill -9 anywhere in a workflow, then rerun (also a script)
machine_state  CI's before/after snapshot of the machine (also a script)
import_graph   the package import graph the layering test checks (also a script)
"""
