"""Test aid, on PYTHONPATH of a subprocess: torch looks not installed, and any package install
is refused and recorded in the file named by DJ_ELASTIC_TEST_INSTALL_LOG.

Data-Juicer's lazy loader pip-installs a missing module when it is first used; a test
that wants to know whether a command would download torch on a fresh machine runs the
command with this on its path and checks the record stays empty.
"""

import importlib.machinery
import os
import subprocess

_HIDDEN = ("torch", "torchvision", "torchaudio")
_find_spec = importlib.machinery.PathFinder.find_spec.__func__


def _hide_torch(cls, name, path=None, target=None):
    if name.split(".")[0] in _HIDDEN:
        return None
    return _find_spec(cls, name, path, target)


def _refuse(cmd, *args, **kwargs):
    with open(os.environ["DJ_ELASTIC_TEST_INSTALL_LOG"], "a", encoding="utf-8") as handle:
        handle.write(f"{cmd}\n")
    raise subprocess.CalledProcessError(1, cmd)


importlib.machinery.PathFinder.find_spec = classmethod(_hide_torch)
subprocess.check_call = _refuse  # the lazy loader installs with check_call (uv, then pip)
