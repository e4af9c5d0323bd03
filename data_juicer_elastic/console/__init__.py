"""What the user sees while a job runs: quiet console output, live progress, the final summary.
Importing it imports neither Ray nor Data-Juicer, and names load on first use: the
entry point imports :mod:`.quiet` into every process that imports Data-Juicer.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "JobDisplay": "displays",
    "StepDisplay": "displays",
    "guard_file_sinks": "log_files",
    "install_console": "quiet",
    "say": "quiet",
    "set_verbose": "quiet",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
