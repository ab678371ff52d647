"""Grid YAML -> validated list of runs, each with a stable id from its resolved config.

A grid is data: a new ablation is a new block under ``runs:`` or a new file. Structure is
checked against ``workflows/schemas/grid.schema.yaml``; every value is then checked by the
config dataclasses. Either failure raises ``GridError`` naming the file and the key, so a
bad grid stops ``snakemake`` at parse time, before any job starts.

Merge order for one run: ``defaults`` -> ``modes.<mode>.set`` (on top of its ``base``) ->
block ``set`` -> block ``mode_set.<mode>`` -> block ``axes`` values. A value that this order
would drop without effect (a default the mode sets again, a block value that is also an axis,
...) is refused, naming both lines (``mor.grids.lint.check_overrides``). A block with
``only_modes`` exists only in those modes; ``modes.<mode>.axes`` are axes every block gets
in that mode (table9's budgets differ between the CPU and the cluster mode);
``modes.<mode>.seeds: n`` repeats every run with train.seed = seed, seed+1, ..., seed+n-1
(data order and initialisation), each its own run (ids of seed > 0 carry ``-s<seed>``);
``load_grid(..., seeds={block: n})`` gives single blocks more (or fewer) seeds, which is how
the claims' adaptive design (``mor.claims.seeding``) adds seeds to the blocks that decide a
claim and to no other; ``seeds={block: [0, 1, 2, 9, 10]}`` names the seed offsets themselves
(the design skips the seeds of a pilot it was sized on). A seed past the mode's own is scored
without lm-eval (``_added_seed``: no table draws it, no claim reads an accuracy). Seed k of a block is the same run whichever way it is asked for (its
id hashes its config), so ``Grid.run`` also finds a seed the grid file does not list.
``model.scale`` always names a paper scale (135M, 360M, ...); the mode's ``scale_map`` turns
it into the scale actually built (CPU scales in the local mode).

One job per module: ``mor.grids.spec`` (where grids live, ``GridError``, the dotted merge, a
mode's base file), ``mor.grids.load`` (``Grid``, ``Run``, modes, ``load_grid``) and
``mor.grids.lint`` (the 7 rules refusing a value that cannot take effect, each error at its
file and line through ``mor.yaml_io.key_line``). This package re-exports what other modules
import, so ``from mor.grids import load_grid`` stays the one spelling.
"""

from __future__ import annotations

from mor.grids.load import Grid, Run, load_grid, mode_settings
from mor.grids.spec import (GRIDS_DIR, MAX_SEEDS, MODES, REPO, SCHEMA_FILE, GridError, all_grids, grid_path, merge,
                            set_dotted)

__all__ = ["GRIDS_DIR", "MAX_SEEDS", "MODES", "REPO", "SCHEMA_FILE", "Grid", "GridError", "Run", "all_grids",
           "grid_path", "load_grid", "merge", "mode_settings", "set_dotted"]
