"""compat.dj_ops_internals: an operator's private attributes and construction hooks, and what
the Ray executor and the local loader call; each check passes against the installed packages and a
moved internal names itself."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.compat import dj_ops_internals
from data_juicer_elastic.compat.targets import ALREADY, APPLIED, ORIGINAL
from data_juicer_elastic.errors import IntegrationError
from data_juicer_elastic.integration.patches import parts_order
from data_juicer_elastic.jobdir.exports import PARTS_INDEX, part_name


def test_check_dj_op_attributes():
    assert "_init_kwargs" in dj_ops_internals.check_dj_op_attributes()


def test_rebase_sets_the_per_attempt_argument_everywhere_data_juicer_reads_it():
    from data_juicer.ops import load_ops

    item = {"whitespace_normalization_mapper": {"work_dir": "/a"}}
    (op,) = load_ops([item])
    moved = {"whitespace_normalization_mapper": {"work_dir": "/b"}}
    dj_ops_internals.rebase_op(op, moved, {"work_dir": "/b"})
    assert op.work_dir == "/b" and op._init_kwargs["work_dir"] == "/b" and op._op_cfg is moved
    assert dj_ops_internals.op_name(op) == dj_ops_internals.op_name(type(op)) == "whitespace_normalization_mapper"


def test_check_dj_op_metaclass():
    assert "OPMetaClass.__call__" in dj_ops_internals.check_dj_op_metaclass()


def test_the_plugin_installed_the_hook():
    import data_juicer.ops.base_op as base_op

    assert dj_ops_internals.metaclass_hook_installed(base_op)


def test_a_moved_metaclass_names_itself():
    import types

    with pytest.raises(AttributeError, match="OPMetaClass.__call__ not found"):
        dj_ops_internals.install_metaclass_hook(types.ModuleType("base_op"), lambda cls, requested: cls)


def test_check_dj_op_error_hooks():
    assert "catch_map_batches_exception" in dj_ops_internals.check_dj_op_error_hooks()


def test_the_plugin_installed_the_hooks():
    import data_juicer.ops.base_op as base_op

    assert dj_ops_internals.error_hooks_installed(base_op)


def test_the_wrap_gets_data_juicer_s_wrapper_and_the_call():
    module = types.ModuleType("base_op")

    def catch_map_batches_exception(method, skip_op_error=False, op_name=None):
        return ("dj", method, skip_op_error, op_name)

    def catch_map_single_exception(method, return_sample=True, skip_op_error=False, op_name=None):
        return ("dj-single", method)

    module.catch_map_batches_exception = catch_map_batches_exception
    module.catch_map_single_exception = catch_map_single_exception
    seen = []
    dj_ops_internals.install_error_hooks(module, lambda built, call: seen.append((built, call)) or "ours")
    assert module.catch_map_batches_exception(len, skip_op_error=True, op_name="x") == "ours"
    assert module.catch_map_single_exception(len, False, True) == "ours"
    (built, call), (built_single, single) = seen
    assert built == ("dj", len, True, "x") and call.batched and call.skip_op_error and call.op_name == "x"
    assert built_single == ("dj-single", len) and not single.batched and single.return_sample is False
    dj_ops_internals.install_error_hooks(module, lambda built, call: "again")  # idempotent: the first wrap stays
    assert module.catch_map_batches_exception(len) == "ours"


def test_a_moved_hook_names_itself():
    with pytest.raises(AttributeError, match="catch_map_batches_exception not found"):
        dj_ops_internals.install_error_hooks(types.ModuleType("base_op"), lambda built, call: built)


class InstallingLoader:
    """Stands for Data-Juicer's LazyLoader("torch"): any attribute access would pip-install torch."""

    def __init__(self):
        self.touched = False

    def __getattr__(self, name):
        self.touched = True
        raise AssertionError("torch was touched: Data-Juicer would install it now")


def _fake_base_op():
    model_utils = types.ModuleType("fake_model_utils")
    model_utils.MODEL_ZOO = {"a-model": object()}
    model_utils.torch = InstallingLoader()

    def free_models(clear_model_zoo=True):
        for _ in model_utils.MODEL_ZOO:
            pass
        if clear_model_zoo:
            model_utils.MODEL_ZOO.clear()
        model_utils.torch.cuda.empty_cache()

    free_models.__module__ = "fake_model_utils"
    base_op = types.ModuleType("fake_base_op")
    base_op.free_models = free_models
    return base_op, model_utils


def test_without_torch_the_model_cache_is_cleared_and_torch_never_touched(monkeypatch):
    base_op, model_utils = _fake_base_op()
    monkeypatch.setitem(__import__("sys").modules, "fake_model_utils", model_utils)
    monkeypatch.setattr(dj_ops_internals, "torch_installed", lambda: False)
    assert dj_ops_internals.install_free_models(base_op)
    base_op.free_models()
    assert model_utils.MODEL_ZOO == {} and not model_utils.torch.touched


def test_with_torch_the_original_runs(monkeypatch):
    base_op, model_utils = _fake_base_op()
    monkeypatch.setitem(__import__("sys").modules, "fake_model_utils", model_utils)
    monkeypatch.setattr(dj_ops_internals, "torch_installed", lambda: True)
    dj_ops_internals.install_free_models(base_op)
    dj_ops_internals.install_free_models(base_op)  # idempotent: wrapped once
    try:
        base_op.free_models()
    except AssertionError:
        pass
    assert model_utils.torch.touched, "the original free_models ran"


def test_data_juicer_operators_call_the_guarded_free_models():
    from data_juicer.ops import base_op

    assert getattr(base_op.free_models, ORIGINAL, None) is not None


def test_check_dj_free_models():
    assert "free_models" in dj_ops_internals.check_dj_free_models()


def test_check_dj_op_fusion():
    assert "fuse_operators" in dj_ops_internals.check_dj_op_fusion()


def test_a_missing_function_fails_the_self_check(monkeypatch):
    import data_juicer.ops.op_fusion as op_fusion

    monkeypatch.delattr(op_fusion, "fuse_operators")
    with pytest.raises(IntegrationError) as info:
        dj_ops_internals.check_dj_op_fusion()
    assert f"{dj_ops_internals.FUSE_OPERATORS} is missing" in str(info.value) and DATA_JUICER_REQUIREMENT in str(
        info.value
    )


def test_a_changed_signature_fails_the_self_check(monkeypatch):
    import data_juicer.ops.op_fusion as op_fusion

    monkeypatch.setattr(op_fusion, "fuse_operators", lambda ops, probe_res=None: ops)
    with pytest.raises(IntegrationError, match="no longer takes mapper_fusion, mapper_fusion_vram_limit"):
        dj_ops_internals.check_dj_op_fusion()


def test_fused_is_data_juicers_fusion():
    from data_juicer.ops import load_ops
    from data_juicer.ops.op_fusion import fuse_operators

    process = [{"words_num_filter": {}}, {"word_repetition_filter": {}}, {"whitespace_normalization_mapper": {}}]

    def names(ops):
        return [op._name for op in ops]

    ours = dj_ops_internals.fused(load_ops(process), mapper_fusion=True, mapper_fusion_vram_limit=0.9)
    theirs = fuse_operators(load_ops(process), mapper_fusion=True, mapper_fusion_vram_limit=0.9)
    assert names(ours) == names(theirs)
    assert len(ours) < len(process)  # the two word filters share a context: fused into one


def test_check_dj_stage_identities():
    found = dj_ops_internals.check_dj_stage_identities()
    assert "_resolved_stage_identities" in found
    assert all(name in found for name in dj_ops_internals.FUNCTIONS)


@pytest.mark.parametrize("name", dj_ops_internals.FUNCTIONS)
def test_a_missing_function_fails_the_self_check_naming_it(monkeypatch, name):
    import data_juicer.core.elasticjuicer.stage_identity as code

    monkeypatch.delattr(code, name)
    with pytest.raises(IntegrationError) as info:
        dj_ops_internals.check_dj_stage_identities()
    assert f"{dj_ops_internals.IDENTITY_MODULE}.{name} is missing" in str(info.value)
    assert DATA_JUICER_REQUIREMENT in str(info.value)


def test_a_missing_module_fails_the_self_check_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, dj_ops_internals.IDENTITY_MODULE, None)  # import raises ImportError
    with pytest.raises(IntegrationError, match=f"cannot import {dj_ops_internals.IDENTITY_MODULE}"):
        dj_ops_internals.check_dj_stage_identities()


def test_doctor_reports_the_missing_function(monkeypatch):
    import data_juicer.core.elasticjuicer.stage_identity as code

    from data_juicer_elastic.integration.doctor import compat_checks

    monkeypatch.delattr(code, "operator_fingerprint")
    failed = [check for check in compat_checks() if not check.ok]
    assert [check.name for check in failed] == ["compat dj_stage_identities"]
    assert "operator_fingerprint is missing" in failed[0].detail


def test_the_functions_are_data_juicers(monkeypatch):
    import data_juicer.core.elasticjuicer.stage_identity as code

    monkeypatch.setattr(code, "operator_fingerprint", lambda op: f"fp-{op}")
    monkeypatch.setattr(code, "assign_stage_identities", lambda ops: {"stages": list(ops)})
    assert dj_ops_internals.op_fingerprint("x") == "fp-x"
    assert dj_ops_internals.identity_manifest(["a", "b"]) == {"stages": ["a", "b"]}


def test_an_adaptive_operator_is_refused_without_the_fingerprint(monkeypatch):
    import data_juicer.core.elasticjuicer.stage_identity as code
    from data_juicer.ops.base_op import OPERATORS

    from data_juicer_elastic.batching.demo import NAME as DEMO

    build = OPERATORS.modules[DEMO]
    build(capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False)  # builds while it exists
    monkeypatch.delattr(code, "operator_fingerprint")
    with pytest.raises(IntegrationError, match="operator_fingerprint is missing"):
        build(capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False)
    build(capacity=400, batch_size=64, adaptive_batching=False, torch_errors=False)  # not adaptive: unaffected


def test_stamped_identities_are_a_copy():
    import types

    cfg, manifest = types.SimpleNamespace(), [{"stage_id": "s0"}]
    assert dj_ops_internals.stamped(cfg) is None
    dj_ops_internals.stamp(cfg, manifest)
    assert dj_ops_internals.stamped(cfg) == manifest and dj_ops_internals.stamped(cfg) is not manifest


def test_check_dj_executor_factory():
    assert "create_executor" in dj_ops_internals.check_dj_executor_factory()


def test_check_dj_ray_executor():
    assert "skip_export=False" in dj_ops_internals.check_dj_ray_executor()


def test_a_missing_executor_fails_the_self_check(monkeypatch):
    import data_juicer.core.executor.ray_executor as module

    monkeypatch.delattr(module, "RayExecutor")
    with pytest.raises(IntegrationError) as info:
        dj_ops_internals.check_dj_ray_executor()
    assert f"{dj_ops_internals.RAY_EXECUTOR_RUN} is missing" in str(info.value) and DATA_JUICER_REQUIREMENT in str(
        info.value
    )


@pytest.mark.parametrize(
    "run",
    [
        lambda self, load_data_np=None: None,  # no skip_export
        lambda self, load_data_np=None, skip_export=True, skip_return=False: None,  # exports unless told
        lambda self, load_data_np=None, skip_export=False: None,  # no skip_return
    ],
)
def test_a_changed_run_fails_the_self_check(monkeypatch, run):
    from data_juicer.core.executor.ray_executor import RayExecutor

    monkeypatch.setattr(RayExecutor, "run", run)
    with pytest.raises(IntegrationError, match=r"RayExecutor.run no longer takes skip_(export|return)=False"):
        dj_ops_internals.check_dj_ray_executor()


def test_run_unexported_builds_ray_executor_and_skips_the_export(monkeypatch):
    from data_juicer.core.executor.ray_executor import RayExecutor

    calls = []

    def run(self, load_data_np=None, skip_export=False, skip_return=False):
        calls.append((self.cfg, skip_export, skip_return))
        return "dataset"

    monkeypatch.setattr(RayExecutor, "__init__", lambda self, cfg: setattr(self, "cfg", cfg))
    monkeypatch.setattr(RayExecutor, "run", run)
    assert dj_ops_internals.run_unexported("cfg") == "dataset"
    assert calls == [("cfg", True, False)]


def test_check_dj_ray_dataset():
    assert "RayDataset.read" in dj_ops_internals.check_dj_ray_dataset()


def test_read_is_replaced_and_restored():
    cls = dj_ops_internals.ray_dataset_class()
    original = dj_ops_internals.read_method()
    saved = dj_ops_internals.replace_read(lambda klass, data_format, paths, **kwargs: (data_format, paths))
    try:
        assert cls.read("json", "x.jsonl") == ("json", "x.jsonl")
    finally:
        dj_ops_internals.restore_read(saved)
    assert dj_ops_internals.read_method() is original


def _parts(directory: Path, count: int, index: bool) -> list[str]:
    directory.mkdir()
    names = [part_name(f"part-{i:05d}-of-{count:05d}") for i in range(count)]
    for name in reversed(names):  # created last to first: listing order is not name order
        (directory / name).write_text('{"text": "x"}\n')
    if index:
        (directory / PARTS_INDEX).write_text("{}\n")
    return [str(directory / name) for name in names]


def test_the_target_is_where_data_juicers_local_loader_looks():
    assert "LocalFormatter.__init__" in dj_ops_internals.check_dj_file_listing()


def test_a_parts_export_is_listed_in_part_order_and_other_directories_as_data_juicer_lists_them(tmp_path):
    from data_juicer.format import formatter

    module = types.SimpleNamespace(find_files_with_suffix=getattr(
        formatter.find_files_with_suffix, ORIGINAL, formatter.find_files_with_suffix
    ))  # fmt: skip
    original = module.find_files_with_suffix
    assert dj_ops_internals.install_file_listing(module, parts_order) == APPLIED
    assert dj_ops_internals.install_file_listing(module, parts_order) == ALREADY
    parts = _parts(tmp_path / "parts", 32, index=True)
    assert module.find_files_with_suffix(tmp_path / "parts", [".jsonl"]) == {".jsonl": parts}
    plain = _parts(tmp_path / "plain", 32, index=False)
    listed = module.find_files_with_suffix(tmp_path / "plain", [".jsonl"])
    assert listed == original(tmp_path / "plain", [".jsonl"]) and sorted(listed[".jsonl"]) == plain
    single = module.find_files_with_suffix(parts[3], [".jsonl"])
    assert single == {".jsonl": [parts[3]]}


def test_the_plugin_installs_it_in_data_juicer():
    from data_juicer.format import formatter

    import data_juicer_elastic.integration.patches as patches
    from data_juicer_elastic.integration import patch_records

    patches.install()
    assert getattr(formatter.find_files_with_suffix, ORIGINAL, None) is not None
    assert patch_records.RECORDS[patch_records.FILE_LISTING].state == "applied"


def test_check_dj_resource_utils():
    assert "check_and_initialize_ray" in dj_ops_internals.check_dj_resource_utils()


def test_ray_is_never_started_inside_and_the_probe_is_restored():
    from data_juicer.utils import resource_utils

    original = resource_utils.check_and_initialize_ray
    with dj_ops_internals.no_ray_start():
        assert resource_utils.check_and_initialize_ray() is False
    assert resource_utils.check_and_initialize_ray is original
