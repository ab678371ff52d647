"""The suite's domain errors as one line each (imports nothing of mor: every layer may use it).

Each domain error's message starts with the file it is about and says what to do, so the
command-line entry points (``python -m mor``, ``python -m mor.launch``) print it as one line
instead of a traceback; so too a file-system error (a full disk, a missing permission). A
traceback stays for what is none of these: a bug, whose frames are what a fix needs.
"""

from __future__ import annotations

import errno
import sys

# (module, class) of every domain error. Looked up only in modules already imported (an error of
# a module never imported cannot have been raised), so no entry point imports torch for them.
DOMAIN_ERRORS = (("mor.grids", "GridError"), ("mor.config", "ConfigError"), ("mor.yaml_io", "YamlError"),
                 ("mor.launch.presets", "PresetError"), ("mor.launch.slurm_submit", "LaunchError"),
                 ("mor.results", "ResultsError"), ("mor.export_hf", "ExportError"),
                 ("mor.checkpoints.native", "CheckpointError"), ("mor.train_log", "TrainLogError"),
                 ("mor.data.fineweb", "SettingsError"), ("mor.data.shards", "ShardError"),
                 ("mor.data.source", "SourceError"), ("mor.lm_eval.tasks", "TaskDataError"),
                 ("mor.lm_eval.hub_cache", "HubCacheError"), ("mor.checkpoints.hf", "InitCheckpointError"),
                 ("mor.launch.lease", "LeaseError"), ("mor.workflow_config", "WorkflowConfigError"))


def is_domain_error(e: BaseException) -> bool:
    for module, name in DOMAIN_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(e, cls):
            return True
    return False


def one_line(e: BaseException) -> str:
    """``error: <message>`` on one line: a multi-line message's lines joined with "; "."""
    if isinstance(e, OSError) and not is_domain_error(e):
        said = e.strerror or str(e)  # our own writers put the file and the remedy in strerror
        if e.filename:
            text = f"{e.filename}: {e.strerror}"
        else:
            text = said
        if e.errno == errno.ENOSPC and "free space" not in text and "once there is room" not in text:
            text += "; free space and run the same command again (what was written before is intact)"
    else:
        text = str(e)
    return "error: " + "; ".join(line.strip() for line in text.splitlines() if line.strip())
