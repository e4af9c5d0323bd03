"""The code fingerprint (issue 13, item 5): what it covers, and which differences refuse a worker."""

from __future__ import annotations

import pytest

from data_juicer_elastic.errors import CodeMismatchError
from data_juicer_elastic.execution.code_fingerprint import check_code, code_fingerprint, tree_sha256

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
