"""The code each stage runs, fingerprinted, so one job's outputs come from one version of it.

What is hashed and when a worker refuses: docs/failure-semantics.md, "One version of the operator
code per job".
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import inspect
import os
from collections.abc import Mapping
from importlib import metadata
from typing import Any, Final

from data_juicer_elastic import __version__
from data_juicer_elastic.compat.dj_config_internals import load_custom_operators
from data_juicer_elastic.errors import CodeMismatchError

_VERSIONED_MODULES: Final = ("data_juicer.ops.base_op", "data_juicer_elastic")
_DISTRIBUTIONS: Final = (("data_juicer", "py-data-juicer"), ("ray", "ray"))


def versions() -> dict[str, str]:
    found = {"data_juicer_elastic": __version__}
    for key, dist in _DISTRIBUTIONS:
        try:
            found[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[key] = "not installed"
    return found


def code_fingerprint(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """This node's fingerprint of the code ``recipe`` runs (imports Data-Juicer's operators)."""
    from data_juicer.ops.base_op import OPERATORS

    custom = [str(p) for p in recipe.get("custom_operator_paths") or []]
    load_custom_operators(custom)
    operators: dict[str, dict[str, str]] = {}
    for name in _operator_names(recipe):
        cls = OPERATORS.modules.get(name)
        operators[name] = _class_files(cls) if cls is not None else {"<not registered>": ""}
    return {
        "versions": versions(),
        "operators": operators,
        "custom_operator_paths": {path: tree_sha256(path) for path in custom},
    }


def check_code(recorded: Mapping[str, Any] | None, here: Mapping[str, Any], *, allow_version_mismatch: bool) -> None:
    """CodeMismatchError unless this node's fingerprint matches the job's (None: an older job)."""
    if recorded is None:
        return
    code = code_differences(recorded, here)
    versions_differ = version_differences(recorded, here)
    if code:
        raise CodeMismatchError(
            "this worker runs different operator code than the job was prepared with: " + "; ".join(code[:4]),
            where="operator code",
            hint="install the job's operator code on this node, or prepare a new job_dir for the new code "
            "(outputs of two versions must not be merged)",
        )
    if versions_differ and not allow_version_mismatch:
        raise CodeMismatchError(
            "this worker's versions differ from the job's: " + "; ".join(versions_differ),
            where="versions",
            hint="install the job's versions on this node, or pass --allow-version-mismatch "
            "(elastic.allow_version_mismatch) if you know the difference does not change results",
        )


def code_differences(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """What differs in the operator code itself (``operators.<name> is {...} here, {...} in the job``)."""
    return _differences(recorded, here, ("operators", "custom_operator_paths"))


def version_differences(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    return _differences(recorded, here, ("versions",))


def tree_sha256(path: str) -> str:
    """One sha256 over a file, or over the module files Python would import from a directory
    (their relative names and bytes, :func:`importable_files`)."""
    digest = hashlib.sha256()
    root = os.path.abspath(path)
    if os.path.isfile(root):
        _feed(digest, root, os.path.basename(root))
        return digest.hexdigest()
    if not os.path.isdir(root):
        return "<missing>"
    for relative, full in importable_files(root):
        _feed(digest, full, relative)
    return digest.hexdigest()


# The suffixes of the import system's file loaders, in the order its FileFinder tries them
# (extension modules, then source, then bytecode): for one module name the first found is imported.
_LOADER_SUFFIXES: Final = (
    *importlib.machinery.EXTENSION_SUFFIXES,
    *importlib.machinery.SOURCE_SUFFIXES,
    *importlib.machinery.BYTECODE_SUFFIXES,
)


def importable_files(root: str) -> list[tuple[str, str]]:
    """(relative name, path) of every file Python would import as a module from the package
    directory ``root`` and the packages below it, sorted, as the import system's FileFinder chooses
    (a package wins over a module file of its name, which wins over a namespace package; ``m.py``
    over a stale ``m.pyc``); a dangling link (Emacs's ``.#m.py`` lock) is left out."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()  # real paths of the directories walked: a link loop is walked once

    def walk(directory: str, prefix: str) -> None:
        real = os.path.realpath(directory)
        if real in seen:
            return
        seen.add(real)
        modules, packages = _listing(directory)
        for name in sorted(set(modules) | set(packages)):
            package, module = packages.get(name), modules.get(name)
            if package is not None and (module is None or "__init__" in _listing(package)[0]):
                walk(package, f"{prefix}{name}/")
            elif module is not None:
                found.append((prefix + os.path.basename(module), module))

    walk(root, "")
    return sorted(found)


def _listing(directory: str) -> tuple[dict[str, str], dict[str, str]]:
    """({module name: the file the import system would load}, {name: package directory})."""
    try:
        entries = list(os.scandir(directory))
    except OSError:  # gone or unreadable while walked: nothing Python could import there
        return {}, {}
    modules: dict[str, tuple[int, str]] = {}
    packages: dict[str, str] = {}
    for entry in entries:
        if _entry_is(entry.is_dir):  # follows a link, as the import system does
            if entry.name.isidentifier() and entry.name != "__pycache__":
                packages[entry.name] = entry.path
            continue
        rank = _module_rank(entry.name)
        if rank is not None and _entry_is(entry.is_file):  # False for a dangling link
            stem = entry.name[: -len(_LOADER_SUFFIXES[rank])]
            if stem not in modules or rank < modules[stem][0]:
                modules[stem] = (rank, entry.path)
    return {name: path for name, (_, path) in modules.items()}, packages


def _module_rank(name: str) -> int | None:
    """The position of the loader suffix a file named ``name`` is imported by, or None."""
    for rank, suffix in enumerate(_LOADER_SUFFIXES):
        if name.endswith(suffix) and name[: -len(suffix)].isidentifier():
            return rank
    return None


def _entry_is(check: Any) -> bool:
    try:
        return check()
    except OSError:
        return False


def _feed(digest: Any, path: str, name: str) -> None:
    digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
    with open(path, "rb") as handle:
        digest.update(hashlib.sha256(handle.read()).digest())


def _operator_names(recipe: Mapping[str, Any]) -> list[str]:
    steps = [step for step in recipe.get("process") or [] if isinstance(step, Mapping)]
    return list(dict.fromkeys(str(name) for step in steps for name in step))


def _class_files(cls: type) -> dict[str, str]:
    files: dict[str, str] = {}
    for klass in cls.__mro__:
        module = getattr(klass, "__module__", "") or ""
        if klass is object or module == "builtins" or module.startswith(_VERSIONED_MODULES) or module in files:
            continue
        try:
            source = inspect.getsourcefile(klass) or inspect.getfile(klass)
            with open(source, "rb") as handle:
                files[module] = hashlib.sha256(handle.read()).hexdigest()
        except (OSError, TypeError):
            files[module] = "<no source>"
    return files


def _differences(recorded: Mapping[str, Any], here: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    out = []
    for key in keys:
        old, new = recorded.get(key) or {}, here.get(key) or {}
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                out.append(f"{key}.{name} is {_short(new.get(name))} here, {_short(old.get(name))} in the job")
    return out


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in sorted(value.items())) + "}"
    text = "absent" if value is None else str(value)
    return text[:12] if len(text) == 64 else text
