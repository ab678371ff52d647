"""The ``mor-slurm`` executor's settings: profile keys and ``--mor-slurm-<name>`` flags.

Snakemake turns each field into a flag (``--mor-slurm-state-poll-s 30``) and a profile key
(``mor-slurm-state-poll-s: 30`` in ``slurm/config.yaml``), listed under "mor-slurm executor
plugin settings" in ``snakemake --help``. A setting left unset falls back to the launcher's
environment variable (``MOR_LAUNCH_<NAME>``), then to the default of
``mor.launch.slurm_state.WatchSettings``, which validates them all (one object, one rule).

No ``from __future__ import annotations`` here: Snakemake reads the field types at run time.
"""

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from mor.launch.slurm_state import WatchSettings

_DEFAULT = WatchSettings()


def _setting(kind: type, help_text: str, name: str) -> Any:
    default = getattr(_DEFAULT, name)
    return field(default=None, metadata={
        "help": f"{help_text} Default {default:g}; unset, ${WatchSettings.env_name(name)} if set.",
        "type": kind, "required": False})


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    """What the workflow's one Slurm watcher does how often (``mor.launch.slurm_state.WatchSettings``)."""

    state_poll_s: Optional[float] = _setting(
        float, "Seconds between two questions to Slurm about every job in flight (one sacct and one squeue call "
               "for all of them; also no more often than --max-status-checks-per-second allows, nor than ten times "
               "the last question took).", "state_poll_s")
    poll_s: Optional[float] = _setting(
        float, "Seconds between two looks for the jobs' result files (no Slurm call).", "poll_s")
    unknown_s: Optional[float] = _setting(
        float, "A job neither sacct nor squeue has known for this many seconds in a row, and that left no result, "
               "fails as vanished.", "unknown_s")
    result_wait_s: Optional[float] = _setting(
        float, "Seconds a job that Slurm says has ended gets for its result file to show up (shared file "
               "systems).", "result_wait_s")
    steps: Optional[int] = _setting(
        int, "Launcher steps (a submission or a collection: a short Python process each) run at once on the "
             "node Snakemake runs on.", "steps")

    def watch(self) -> WatchSettings:
        """The settings resolved and validated: given here, else ``MOR_LAUNCH_<NAME>``, else the default."""
        return WatchSettings.resolve(**{f.name: getattr(self, f.name) for f in fields(self)})
