"""The code fingerprint: what it covers, and which differences refuse a worker."""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import CodeMismatchError
from data_juicer_elastic.execution.code_fingerprint import check_code, code_fingerprint, importable_files, tree_sha256

OPS = """
from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("fingerprint_test_mapper")
class FingerprintTestMapper(Mapper):
    def process_single(self, sample):
        return sample
"""


def test_a_fingerprint_names_operator_files_custom_paths_and_versions(tmp_path):
    package = tmp_path / "fp_ops"
    package.mkdir()
    (package / "__init__.py").write_text(OPS)
    recipe = {
        "process": [{"whitespace_normalization_mapper": None}, {"fingerprint_test_mapper": None}],
        "custom_operator_paths": [str(package)],
    }
    code = code_fingerprint(recipe)
    assert set(code["versions"]) == {"data_juicer", "data_juicer_elastic", "ray"}
    assert list(code["operators"]["whitespace_normalization_mapper"]) == [
        "data_juicer.ops.mapper.whitespace_normalization_mapper"
    ], "base_op is covered by the Data-Juicer version"
    assert list(code["operators"]["fingerprint_test_mapper"]) == ["fp_ops"]
    assert code["custom_operator_paths"] == {str(package): tree_sha256(str(package))}
    check_code(code, code, allow_version_mismatch=False)  # the same node agrees with itself


def test_tree_hash_sees_names_and_bytes_but_not_bytecode(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    before = tree_sha256(str(tmp_path))
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert tree_sha256(str(tmp_path)) == before
    (tmp_path / "a.py").write_text("x = 2\n")
    assert tree_sha256(str(tmp_path)) != before
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "a.py").rename(tmp_path / "b.py")
    assert tree_sha256(str(tmp_path)) != before


JOB = {
    "versions": {"data_juicer": "1.6.1", "data_juicer_elastic": "0.1.0", "ray": "2.60.0"},
    "operators": {"op": {"mod": "a" * 64}},
    "custom_operator_paths": {"/ops": "b" * 64},
}


@pytest.mark.parametrize(
    "section, key, value, refused_even_with_flag",
    [
        ("operators", "op", {"mod": "c" * 64}, True),
        ("custom_operator_paths", "/ops", "d" * 64, True),
        ("versions", "ray", "2.59.0", False),
        ("versions", "data_juicer", "1.6.2", False),
    ],
)
def test_code_differences_always_refuse_version_differences_only_without_the_flag(
    section, key, value, refused_even_with_flag
):
    here = {**JOB, section: {**JOB[section], key: value}}
    with pytest.raises(CodeMismatchError) as info:
        check_code(JOB, here, allow_version_mismatch=False)
    assert f"{section}.{key}" in info.value.message
    if refused_even_with_flag:
        with pytest.raises(CodeMismatchError):
            check_code(JOB, here, allow_version_mismatch=True)
    else:
        check_code(JOB, here, allow_version_mismatch=True)
    check_code(None, here, allow_version_mismatch=False)  # a job prepared before fingerprints: not checked


# Names an operator directory may hold: modules, packages, and what editors, Python and users
# leave beside them (Emacs's dangling lock link, backups, swap files, bytecode, data, ...).
_STEMS = ("a", "__init__", "pkg", ".#a", "a-b", "2a")
_SUFFIXES = (".py", ".pyc", ".so", ".abi3.so", importlib.machinery.EXTENSION_SUFFIXES[0], ".py~", ".txt", ".swp", "")
_ENTRY = st.tuples(
    st.lists(st.sampled_from(("pkg", "a", "__pycache__", "my-data")), max_size=2),
    st.sampled_from(_STEMS),
    st.sampled_from(_SUFFIXES),
    st.sampled_from(("file", "dir", "dangling", "link")),
)


def _imported_by_python(root: Path) -> list[tuple[str, str]]:
    """The oracle: what the import system's own FileFinder resolves, package by package."""
    loaders = (
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
        (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
    )
    found = []

    def walk(directory: Path, prefix: str) -> None:
        finder = importlib.machinery.FileFinder(str(directory), *loaders)
        names = {p.name.split(".")[0] for p in directory.iterdir()} | {"__init__"}
        for name in sorted(n for n in names if n.isidentifier()):
            spec = finder.find_spec(name)
            if spec is None or name == "__pycache__":
                continue
            if spec.submodule_search_locations is not None:  # a package or a namespace package
                walk(directory / name, f"{prefix}{name}/")
            else:
                found.append((prefix + os.path.basename(spec.origin), spec.origin))

    walk(root, "")
    return sorted(found)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(_ENTRY, max_size=16))
def test_the_custom_operator_hash_covers_exactly_what_python_would_import(tmp_path_factory, entries):
    root = tmp_path_factory.mktemp("ops")
    (root / "__init__.py").write_text("from . import a\n")
    for folders, stem, suffix, kind in entries:
        directory = root.joinpath(*folders)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:  # a file or a link is where a folder would be: not this entry
            continue
        path = directory / f"{stem}{suffix}"
        if os.path.lexists(path):
            continue
        if kind == "dir":
            path.mkdir()
        elif kind == "dangling":
            path.symlink_to(f"user@host.{len(entries)}:1700000000")  # what Emacs leaves while a buffer is edited
        elif kind == "link":
            path.symlink_to(root / "__init__.py")
        else:
            path.write_text(f"# {stem}{suffix}\n")
    expected = _imported_by_python(root)
    assert importable_files(str(root)) == expected
    before = tree_sha256(str(root))
    for _, path in expected:  # every imported file's bytes count ...
        original = Path(path).read_bytes()
        Path(path).write_bytes(original + b"# edited\n")
        assert tree_sha256(str(root)) != before, path
        Path(path).write_bytes(original)
    junk = root / ".#__init__.py"  # ... and what Python would not import never does
    if not os.path.lexists(junk):
        junk.symlink_to("nobody@nowhere.1:1")
        assert tree_sha256(str(root)) == before


def test_a_package_linked_into_itself_is_walked_once(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.py").write_text("x = 1\n")
    (tmp_path / "sub" / "again").symlink_to(tmp_path)  # Python would import sub.again.sub.again... for ever
    assert [name for name, _ in importable_files(str(tmp_path))] == ["__init__.py", "sub/m.py"]
