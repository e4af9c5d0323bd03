"""What the user sees while a job runs: quiet console output, live progress, the final summary.

* :mod:`.terminal`: the console stream and the one live line kept below other output;
* :mod:`.quiet`: the console filter (``-v`` / ``DJ_ELASTIC_VERBOSE=1`` shows everything),
  :func:`say` for the plugin's own lines;
* :mod:`.displays`: progress of the whole job (the live line);
* :mod:`.meter`: the rate and the time left both displays show, steady while counts move in steps;
* :mod:`.step_display`: progress of prepare and merge steps;
* :mod:`.summary`: the lines a finished run ends with;
* :mod:`.log_files`: log files that fail quietly and once (a full disk costs their lines, not the run).

Importing it imports neither Ray nor Data-Juicer, and names load on first use: the
entry point imports :mod:`.quiet` into every process that imports Data-Juicer.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "JobDisplay": "displays",
    "StepDisplay": "step_display",
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
