"""py-data-juicer 1.6.1: ``data_juicer.format.formatter.find_files_with_suffix``, the listing its
``LocalFormatter`` reads a dataset directory in (the default executor's local loader), wrapped so
that a parts export is read in the order of its parts.

Why.  It lists in the filesystem's own order (``Path.rglob``; hash order on ext4), which the
dataset keeps, so a parts export would come out shuffled by part.  The replacement uses
``reorder(path, found)`` when that gives an order (only for a directory holding a parts index);
every other listing stays exactly as Data-Juicer makes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat import ORIGINAL, dj_moved, import_target, wrap_function

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
    formatter = import_target(MODULE, where=TARGET)
    function = getattr(formatter, "find_files_with_suffix", None)
    original = getattr(function, ORIGINAL, function)
    local = getattr(formatter, "LocalFormatter", None)
    if not callable(original) or local is None:
        raise dj_moved(f"{TARGET} or {MODULE}.LocalFormatter is missing", where=TARGET)
    if list(inspect.signature(original).parameters)[:2] != ["path", "suffixes"]:
        raise dj_moved(f"{TARGET} no longer takes (path, suffixes)", where=TARGET)
    if "find_files_with_suffix(" not in inspect.getsource(local.__init__):
        raise dj_moved(f"{MODULE}.LocalFormatter.__init__ no longer lists files with {TARGET}", where=TARGET)
    return f"{TARGET} found, called by LocalFormatter.__init__"
