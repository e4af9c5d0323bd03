"""Named crash points for fault tests of real processes (never set in production).

``DJ_ELASTIC_TEST_CRASH_AT=<op>:<text>`` makes this process SIGKILL itself at the
first job-directory file operation ``<op>`` (see ``jobdir.fsio.fault_point``: create,
write, link, replace, ...) whose path contains ``<text>``.  Example: a finalize
coordinator killed mid-merge::

    DJ_ELASTIC_TEST_CRASH_AT=write:.merged.jsonl.tmp dj-process --config recipe.yaml
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Final

from data_juicer_elastic.jobdir import fsio

CRASH_ENV: Final = "DJ_ELASTIC_TEST_CRASH_AT"


def install_from_env() -> bool:
    spec = os.environ.get(CRASH_ENV, "")
    op, sep, text = spec.partition(":")
    if not (sep and op and text):
        return False

    def hook(name: str, path: Path) -> None:
        if name == op and text in str(path):
            os.kill(os.getpid(), signal.SIGKILL)

    fsio.set_fault_hook(hook)
    return True
