"""py-data-juicer 1.6.1: ``data_juicer.format.formatter.find_files_with_suffix``, the listing its
``LocalFormatter`` (the default executor's local loader) reads a dataset directory in, wrapped so
that a parts export is read in the order of its parts (docs/output-layouts.md): it lists in the
filesystem's order (hash order on ext4).  Every other listing stays exactly as Data-Juicer makes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, import_target, target_function, wrap_function

MODULE: Final = "data_juicer.format.formatter"
TARGET: Final = f"{MODULE}.find_files_with_suffix"

Listing = dict[str, list[str]]  # suffix -> files, as find_files_with_suffix returns them


def install(formatter: ModuleType, reorder: Callable[[Any, Listing], Listing | None]) -> str:
    """Wrap the formatter module's ``find_files_with_suffix``: :data:`APPLIED`, :data:`ALREADY` or
    why the target is missing."""

    def make(original):
        def find_files_with_suffix(path, suffixes=None):
            found = original(path, suffixes)
            ordered = reorder(path, found)
            return found if ordered is None else ordered

        return find_files_with_suffix

    return wrap_function(formatter, "find_files_with_suffix", make, missing=f"{TARGET} not found")


def self_check() -> str:
    target_function(MODULE, "find_files_with_suffix", parameters=("path", "suffixes"))
    local = getattr(import_target(MODULE, where=TARGET), "LocalFormatter", None)
    if local is None:
        raise dj_moved(f"{MODULE}.LocalFormatter is missing", where=TARGET)
    if "find_files_with_suffix(" not in inspect.getsource(local.__init__):
        raise dj_moved(f"{MODULE}.LocalFormatter.__init__ no longer lists files with {TARGET}", where=TARGET)
    return f"{TARGET} found, called by LocalFormatter.__init__"
