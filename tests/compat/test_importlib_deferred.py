"""Deferred patching: complete, in-flight and not-yet-imported modules (synthetic packages)."""

from __future__ import annotations

import importlib
import sys
import uuid

import pytest

from data_juicer_elastic.compat import importlib_deferred as deferred


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh package name on sys.path; its modules are removed from sys.modules afterwards."""
    name = f"djelastic_probe_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    root.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, root
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def test_complete_module_is_patched_now(package):
    name, root = package
    (root / "__init__.py").write_text("")
    (root / "target.py").write_text("VALUE = 1\n")
    module = importlib.import_module(f"{name}.target")
    seen = []
    assert deferred.when_imported(f"{name}.target", seen.append) == "now"
    assert seen == [module]


def test_not_yet_imported_module_is_patched_after_it_executed(package):
    name, root = package
    (root / "__init__.py").write_text("")
    (root / "target.py").write_text("FIRST = 1\nLAST = 2\n")
    seen = []
    assert deferred.when_imported(f"{name}.target", lambda m: seen.append(m.LAST)) == "on-import"
    assert seen == []
    module = importlib.import_module(f"{name}.target")
    assert seen == [2]
    assert "exec_module" not in vars(module.__loader__)  # the loader is left as it was
    assert f"{name}.target" not in deferred.pending()


def test_in_flight_module_is_patched_when_it_finished(package):
    name, root = package
    # target imports a plugin half-way, like data_juicer.config.config imports data_juicer.ops
    (root / "__init__.py").write_text("from . import target\nAFTER_TARGET = True\n")
    (root / "plugin.py").write_text(
        "from data_juicer_elastic.compat import importlib_deferred as deferred\n"
        "SEEN = []\n"
        f"HOW = deferred.when_imported('{name}.target', lambda m: SEEN.append(hasattr(m, 'DEFINED_LATE')))\n"
    )
    (root / "target.py").write_text("from . import plugin\nDEFINED_LATE = True\n")
    package_module = importlib.import_module(name)
    plugin = sys.modules[f"{name}.plugin"]
    assert plugin.HOW == "in-flight"
    assert plugin.SEEN == [True]  # ran once, after target's last line
    assert type(package_module).__name__ == "module"  # the parent's class was restored
    assert package_module.AFTER_TARGET


def test_callback_error_does_not_break_the_import(package):
    name, root = package
    (root / "__init__.py").write_text("")
    (root / "target.py").write_text("VALUE = 1\n")
    errors = []

    def broken(module):
        raise AttributeError("moved")

    deferred.when_imported(f"{name}.target", broken, lambda mod, exc: errors.append((mod, str(exc))))
    assert importlib.import_module(f"{name}.target").VALUE == 1
    assert errors == [(f"{name}.target", "moved")]


def test_finder_tolerates_a_finder_that_asks_the_meta_path_again(package, monkeypatch):
    name, root = package
    (root / "__init__.py").write_text("")
    (root / "target.py").write_text("VALUE = 1\n")

    class Reasking:
        def find_spec(self, fullname, path, target=None):
            if fullname != f"{name}.target":
                return None
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        return spec
            return None

    monkeypatch.setattr(sys, "meta_path", [Reasking(), *sys.meta_path])
    seen = []
    deferred.when_imported(f"{name}.target", seen.append)
    assert importlib.import_module(f"{name}.target").VALUE == 1
    assert len(seen) == 1


def test_self_check_finds_the_importlib_behaviour_it_relies_on():
    assert "ModuleSpec._initializing" in deferred.check_importlib_deferred()
    assert not [name for name in sys.modules if name.startswith("dj_elastic_probe_")], "the probe is not left behind"
