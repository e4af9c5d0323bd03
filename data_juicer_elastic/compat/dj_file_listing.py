"""py-data-juicer 1.6.1: the file listing its local loader reads a dataset directory in, wrapped so
that a parts export is read in the order of its parts.

Target: ``data_juicer.format.formatter.find_files_with_suffix``, the name ``LocalFormatter.__init__``
calls (``data_juicer.utils.file_utils.find_files_with_suffix``, imported by name).  The default
executor (``dj-process``, ``dj-analyze``) loads a local directory through it.

Why.  It lists a directory with ``Path.rglob("*")``: in the filesystem's own order (hash order on
ext4), which the loaded dataset keeps.  A parts export (``elastic.export_layout: parts``) holds
its rows in input order by part name; read in listing order, its rows would come out shuffled by
part.  The replacement asks ``reorder(path, found)`` for another order and uses it when one is
given (the plugin gives one only for a directory holding a parts index, ``integration.patches``);
every other listing stays exactly as Data-Juicer makes it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat import ALREADY, APPLIED, ORIGINAL, dj_moved, import_target, is_installed

MODULE: Final = "data_juicer.format.formatter"
TARGET: Final = f"{MODULE}.find_files_with_suffix"

Listing = dict[str, list[str]]  # suffix -> files, as find_files_with_suffix returns them


def install(formatter: ModuleType, reorder: Callable[[Any, Listing], Listing | None]) -> str:
    """Wrap the formatter module's ``find_files_with_suffix``: :data:`APPLIED`, :data:`ALREADY` or
    why the target is missing."""
    original = getattr(formatter, "find_files_with_suffix", None)
    if not callable(original):
        return f"{TARGET} not found"
    if is_installed(original):
        return ALREADY

    @functools.wraps(original)
    def find_files_with_suffix(path, suffixes=None):
        found = original(path, suffixes)
        ordered = reorder(path, found)
        return found if ordered is None else ordered

    setattr(find_files_with_suffix, ORIGINAL, original)
    formatter.find_files_with_suffix = find_files_with_suffix
    return APPLIED


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
