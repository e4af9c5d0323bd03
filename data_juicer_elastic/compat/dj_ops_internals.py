"""Data-Juicer's operators and executors (py-data-juicer 1.6.1): an operator's private attributes,
the hooks its construction goes through, and what the Ray executor and the default one's local
loader call; Data-Juicer has a hook for none of them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import inspect
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat.targets import (
    ALREADY,
    APPLIED,
    ORIGINAL,
    dj_moved,
    import_target,
    is_installed,
    target_function,
    wrap_function,
)

BASE_OP: Final = "data_juicer.ops.base_op"
RAY_EXECUTOR_MODULE: Final = "data_juicer.core.executor.ray_executor"

# --- The private attributes of an operator (``data_juicer.ops.base_op.OP``), set by ``OP.__init__``
# / the registry and read by Data-Juicer itself: ``_name``, ``_init_kwargs`` (what Ray actors are
# rebuilt from and ``operator_fingerprint`` hashes), ``_op_cfg`` (the recipe entry), and the class
# flags ``_batched_op`` and ``_supports_adaptive_batching``.  Warm operators re-base a cached instance
# exactly where building it anew would (docs/warm-operators.md); adaptive batching names,
# fingerprints and vets operators as Data-Juicer does.

OP_CLASS: Final = f"{BASE_OP}.OP"
NAME: Final = "_name"
INIT_KWARGS: Final = "_init_kwargs"
OP_CFG: Final = "_op_cfg"
BATCHED_FLAG: Final = "_batched_op"
ADAPTIVE_FLAG: Final = "_supports_adaptive_batching"


def op_name(op: Any) -> str:
    """The registered name of an operator (instance or class), else its class name."""
    fallback = op.__name__ if isinstance(op, type) else type(op).__name__
    return getattr(op, NAME, None) or fallback


def rebase_op(op: Any, item: Any, per_attempt: Mapping[str, Any]) -> None:
    """Give a built operator the per-attempt arguments ``per_attempt`` of recipe entry ``item``,
    where Data-Juicer's constructor would have put them."""
    for name, value in per_attempt.items():
        setattr(op, name, value)
        init_kwargs = getattr(op, INIT_KWARGS, None)
        if isinstance(init_kwargs, Mapping) and name in init_kwargs:
            setattr(op, INIT_KWARGS, {**init_kwargs, name: value})
    setattr(op, OP_CFG, item)


def is_batched_class(cls: type) -> bool:
    return bool(getattr(cls, BATCHED_FLAG, False))


def supports_adaptive_batching(cls: type) -> bool:
    return bool(getattr(cls, ADAPTIVE_FLAG, False))


def check_dj_op_attributes() -> str:
    try:
        from data_juicer.ops import load_ops
        from data_juicer.ops.base_op import OP, Mapper
    except ImportError as exc:
        raise dj_moved(f"cannot import {BASE_OP}: {exc}", where=OP_CLASS) from exc
    work_dir = "/nonexistent/dj-elastic-doctor"
    item = {"whitespace_normalization_mapper": {"work_dir": work_dir}}
    (op,) = load_ops([item])
    if op_name(op) != "whitespace_normalization_mapper" or getattr(op, OP_CFG, None) != item:
        raise dj_moved(f"{OP_CLASS} built by load_ops no longer carries {NAME} and {OP_CFG}", where=OP_CLASS)
    if (getattr(op, INIT_KWARGS, None) or {}).get("work_dir") != work_dir:
        raise dj_moved(f"{OP_CLASS} no longer keeps its constructor arguments in {INIT_KWARGS}", where=OP_CLASS)
    for flag, owner in ((BATCHED_FLAG, OP), (ADAPTIVE_FLAG, Mapper)):
        if flag not in vars(owner):
            raise dj_moved(f"{owner.__module__}.{owner.__name__} no longer has the class flag {flag}", where=OP_CLASS)
    return f"{OP_CLASS}: {NAME}, {INIT_KWARGS}, {OP_CFG}, {BATCHED_FLAG}, {ADAPTIVE_FLAG} found"


# --- ``data_juicer.ops.base_op.OPMetaClass.__call__``, wrapped once per process so that
# ``adaptive_batching: true`` gives an operator ``AdaptiveBatchingMixin`` however it is built
# (``load_ops``, a Ray actor built from ``op.__class__``): it instantiates the class
# ``resolve(cls, adaptive_batching)`` picks (``batching.mixin``).

OP_METACLASS: Final = f"{BASE_OP}.OPMetaClass.__call__"


def _metaclass_call(module: ModuleType) -> tuple[type | None, Any]:
    meta = getattr(module, "OPMetaClass", None)
    return (meta, meta.__dict__.get("__call__")) if isinstance(meta, type) else (None, None)


def install_metaclass_hook(module: ModuleType, resolve: Callable[[type, Any], type]) -> None:
    """Construct ``resolve(cls, kwargs.get("adaptive_batching"))`` instead of ``cls`` (idempotent)."""
    meta, original = _metaclass_call(module)
    if original is None:
        raise AttributeError(f"{OP_METACLASS} not found")

    def make(original):
        def __call__(cls, *args, **kwargs):  # noqa: N807 - the metaclass hook
            return original(resolve(cls, kwargs.get("adaptive_batching")), *args, **kwargs)

        return __call__

    wrap_function(meta, "__call__", make)


def metaclass_hook_installed(module: ModuleType) -> bool:
    return is_installed(_metaclass_call(module)[1])


def check_dj_op_metaclass() -> str:
    module = import_target(BASE_OP, where=OP_METACLASS)
    if _metaclass_call(module)[1] is None:
        raise dj_moved(f"{OP_METACLASS} not found", where=OP_METACLASS)
    return f"{OP_METACLASS}: found{' (wrapped)' if metaclass_hook_installed(module) else ''}"


# --- ``data_juicer.ops.base_op.catch_map_batches_exception`` / ``catch_map_single_exception``,
# wrapped so an elastic shard can quarantine failing rows.  Every Mapper's and Filter's ``__init__``
# wraps its ``process_*`` / ``compute_stats_*`` methods with them; with ``skip_op_error`` (the
# default) that wrapper drops every row of a batch that raised.  Each call still builds
# Data-Juicer's wrapper, then ``wrap(built, call)`` decides what the operator gets
# (docs/architecture.md, "quarantine").  ``__init__`` looks the hooks up as module globals, so
# operators built before :func:`install_error_hooks` keep Data-Juicer's wrappers.

BATCHES: Final = "catch_map_batches_exception"
SINGLE: Final = "catch_map_single_exception"
ERROR_HOOKS: Final = f"{BASE_OP}.{BATCHES} / {SINGLE}"
# The parameters each hook is called with (checked: a renamed one moves the hook).
PARAMETERS: Final = {
    BATCHES: ("method", "skip_op_error", "op_name"),
    SINGLE: ("method", "return_sample", "skip_op_error", "op_name"),
}


@dataclass(frozen=True)
class HookCall:
    """One call of a hook: what the operator's ``__init__`` asked to be wrapped."""

    batched: bool  # catch_map_batches_exception (True) or catch_map_single_exception
    method: Callable[..., Any]  # the operator's bound method (process_batched, compute_stats_single, ...)
    skip_op_error: bool
    op_name: str | None
    return_sample: bool = True  # single only: False for a Filter's keep decision

    @property
    def keep_decision(self) -> bool:
        """True when the method is a Filter's keep decision (``process_batched`` /
        ``process_single`` of a Filter): it returns booleans, one per row, not rows."""
        filter_class = getattr(sys.modules.get(BASE_OP), "Filter", None)
        op = getattr(self.method, "__self__", None)
        name = getattr(self.method, "__name__", "")
        return filter_class is not None and isinstance(op, filter_class) and name.startswith("process_")


Wrap = Callable[[Callable[..., Any], HookCall], Callable[..., Any]]


def install_error_hooks(module: ModuleType, wrap: Wrap) -> None:
    """Replace both hooks of ``module`` (idempotent): each builds Data-Juicer's wrapper, then returns
    ``wrap(built, HookCall(...))``.  AttributeError naming the hook when one is missing."""
    for name in (BATCHES, SINGLE):
        if wrap_function(module, name, functools.partial(_error_hook, name, wrap=wrap)) not in (APPLIED, ALREADY):
            raise AttributeError(f"{BASE_OP}.{name} not found")


def _error_hook(name: str, original: Callable[..., Any], wrap: Wrap) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def hook(*args: Any, **kwargs: Any) -> Any:
        built = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        call = HookCall(
            batched=name == BATCHES,
            method=values["method"],
            skip_op_error=bool(values["skip_op_error"]),
            op_name=values["op_name"],
            return_sample=bool(values.get("return_sample", True)),
        )
        return wrap(built, call)

    return hook


def error_hooks_installed(module: ModuleType) -> bool:
    return all(is_installed(getattr(module, name, None)) for name in (BATCHES, SINGLE))


def check_dj_op_error_hooks() -> str:
    module = import_target(BASE_OP, where=ERROR_HOOKS)
    for name, expected in PARAMETERS.items():
        target_function(BASE_OP, name, parameters=expected)
    for cls, wrapped in (("Mapper", ("process",)), ("Filter", ("process", "compute_stats"))):
        source = inspect.getsource(getattr(module, cls).__init__)
        if BATCHES not in source or SINGLE not in source:
            raise dj_moved(
                f"{BASE_OP}.{cls}.__init__ no longer wraps {'/'.join(wrapped)} with the hooks", where=ERROR_HOOKS
            )
    return f"{ERROR_HOOKS}: found{' (wrapped)' if error_hooks_installed(module) else ''}"


# --- ``data_juicer.ops.base_op.free_models`` (and the ``MODEL_ZOO`` dict of its module), wrapped to
# keep Data-Juicer from installing torch when nothing needs it.  Every Mapper and Filter the default
# executor runs ends with ``free_models()``, whose ``torch.cuda.empty_cache()`` goes through
# Data-Juicer's ``LazyLoader``: without torch, that makes it ``pip install torch`` (several GB), even
# for a text-length filter.  Without torch no model holds accelerator memory, so the replacement
# only clears the model cache; with torch, the original runs.

FREE_MODELS: Final = f"{BASE_OP}.free_models"


def torch_installed() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def install_free_models(base_op: ModuleType) -> bool:
    """Wrap ``base_op.free_models``; False when it is not there."""

    def make(original):
        model_utils = sys.modules.get(getattr(original, "__module__", ""), None)

        def free_models(clear_model_zoo=True):
            if torch_installed():
                return original(clear_model_zoo)
            zoo = getattr(model_utils, "MODEL_ZOO", None)
            if clear_model_zoo and isinstance(zoo, dict):
                zoo.clear()  # what the original does besides moving models off the GPU
            return None

        return free_models

    return wrap_function(base_op, "free_models", make) in (APPLIED, ALREADY)


def check_dj_free_models() -> str:
    model_utils = sys.modules.get(target_function(BASE_OP, "free_models").__module__, None)
    if not isinstance(getattr(model_utils, "MODEL_ZOO", None), dict):
        raise dj_moved(f"the MODEL_ZOO of {FREE_MODELS}'s module is missing", where=FREE_MODELS)
    return f"{FREE_MODELS} and {model_utils.__name__}.MODEL_ZOO found"


# --- ``data_juicer.ops.op_fusion.fuse_operators(ops, probe_res=None, mapper_fusion=True,
# mapper_fusion_vram_limit=0.9)``, the operator fusion ``RayExecutor.run`` applies (``data_juicer.ops``
# does not export it): stage identities are computed on the operator list as ``RayExecutor.run``
# prepares it (``execution.stage_identities``), with ``op_fusion: true`` the fused one.

FUSION_MODULE: Final = "data_juicer.ops.op_fusion"
FUSE_OPERATORS: Final = f"{FUSION_MODULE}.fuse_operators"
FUSION_KEYWORDS: Final = ("mapper_fusion", "mapper_fusion_vram_limit")


def _fuse_operators() -> Callable[..., Any]:
    found = target_function(FUSION_MODULE, "fuse_operators", why=": a recipe with op_fusion cannot be prepared")
    parameters = inspect.signature(found).parameters
    missing = [name for name in FUSION_KEYWORDS if name not in parameters]
    if missing:
        raise dj_moved(
            f"{FUSE_OPERATORS} no longer takes {', '.join(missing)}: {tuple(parameters)}", where=FUSE_OPERATORS
        )
    return found


def fused(ops: Sequence[Any], *, mapper_fusion: bool, mapper_fusion_vram_limit: float) -> list[Any]:
    """``ops`` fused as ``RayExecutor.run`` fuses them."""
    return _fuse_operators()(ops, mapper_fusion=mapper_fusion, mapper_fusion_vram_limit=mapper_fusion_vram_limit)


def check_dj_op_fusion() -> str:
    _fuse_operators()
    return f"{FUSE_OPERATORS}(ops, {', '.join(FUSION_KEYWORDS)}) found"


# --- Data-Juicer's stage identities (``data_juicer.core.elasticjuicer.stage_identity
# .assign_stage_identities``, ``operator_fingerprint``) and the private cfg field
# ``_resolved_stage_identities`` that ``RayExecutor.run`` reads.  A shard run uses the identities this
# package computed and checked (``execution.shard_runner``).  No fallback: identities computed any
# other way would not match (docs/architecture.md, "compat").

IDENTITY_MODULE: Final = "data_juicer.core.elasticjuicer.stage_identity"
FUNCTIONS: Final = ("assign_stage_identities", "operator_fingerprint")
FIELD: Final = "_resolved_stage_identities"
STAGE_IDENTITIES: Final = f"{RAY_EXECUTOR_MODULE}.RayExecutor cfg.{FIELD}"


def _identity_function(name: str) -> Callable[..., Any]:
    return target_function(IDENTITY_MODULE, name, why=": Data-Juicer's stage identities cannot be computed")


def check_identity_functions() -> None:
    """IntegrationError naming the first of :data:`FUNCTIONS` this Data-Juicer lacks."""
    for name in FUNCTIONS:
        _identity_function(name)


def identity_manifest(ops: Sequence[Any]) -> dict[str, Any]:
    """Data-Juicer's identity manifest (schema_version, pipeline_fingerprint, stages) of ``ops``."""
    return _identity_function("assign_stage_identities")(ops)


def op_fingerprint(op: Any) -> str:
    """Data-Juicer's fingerprint of one operator (class, name, constructor arguments but ``work_dir``)."""
    return _identity_function("operator_fingerprint")(op)


def stamp(cfg: Any, manifest: Any) -> None:
    """Give RayExecutor these stage identities (a copy: it may change what it is given)."""
    setattr(cfg, FIELD, copy.deepcopy(manifest))


def stamped(cfg: Any) -> Any:
    """The stage identities on the cfg (None when none were stamped)."""
    return getattr(cfg, FIELD, None)


def check_dj_stage_identities() -> str:
    check_identity_functions()
    try:
        from data_juicer.core.executor.ray_executor import RayExecutor
    except ImportError as exc:
        raise dj_moved(f"cannot import {RAY_EXECUTOR_MODULE}: {exc}", where=STAGE_IDENTITIES) from exc
    if FIELD not in inspect.getsource(RayExecutor):
        raise dj_moved(f"{RAY_EXECUTOR_MODULE}.RayExecutor no longer uses cfg.{FIELD}", where=STAGE_IDENTITIES)
    return f"{IDENTITY_MODULE}.{{{', '.join(FUNCTIONS)}}} found; {STAGE_IDENTITIES}: used by RayExecutor"


# --- ``data_juicer.core.executor.factory.ExecutorFactory.create_executor`` (a static or class method
# taking the executor type first), wrapped so that it builds the elastic executor for
# ``elastic_sharded`` (docs/architecture.md, "How does dj-process reach our executor?").

FACTORY_MODULE: Final = "data_juicer.core.executor.factory"
CREATE_EXECUTOR: Final = f"{FACTORY_MODULE}.ExecutorFactory.create_executor"


def _factory_method(module: ModuleType) -> tuple[Any, Any, str | None]:
    """``(ExecutorFactory, its raw create_executor, why it cannot be wrapped or None)``."""
    factory = getattr(module, "ExecutorFactory", None)
    raw = inspect.getattr_static(factory, "create_executor", None) if factory is not None else None
    if not isinstance(raw, (staticmethod, classmethod)):
        return factory, raw, "not found" if raw is None else "no longer a static/class method"
    return factory, raw, None


def wrap_create_executor(module: ModuleType, intercept: Callable[[Any], Any]) -> str:
    """``create_executor`` returns ``intercept(executor_type)`` when that is not None, else what
    Data-Juicer's returns; :data:`APPLIED`, :data:`ALREADY` or why the target is missing."""
    factory, raw, missing = _factory_method(module)
    if missing is not None:
        return missing
    original = raw.__func__
    if is_installed(original):
        return ALREADY
    is_static = isinstance(raw, staticmethod)

    @functools.wraps(original)
    def create_executor(*args, **kwargs):
        positional = args if is_static else args[1:]
        executor_type = kwargs.get("executor_type", positional[0] if positional else None)
        executor = intercept(executor_type)
        return original(*args, **kwargs) if executor is None else executor

    setattr(create_executor, ORIGINAL, original)
    factory.create_executor = staticmethod(create_executor) if is_static else classmethod(create_executor)
    return APPLIED


def check_dj_executor_factory() -> str:
    missing = _factory_method(import_target(FACTORY_MODULE, where=CREATE_EXECUTOR))[2]
    if missing is not None:
        raise dj_moved(f"{CREATE_EXECUTOR}: {missing}", where=CREATE_EXECUTOR)
    return f"{CREATE_EXECUTOR}: static/class method found"


# --- ``data_juicer.core.executor.ray_executor.RayExecutor.run(load_data_np=None, skip_export=False,
# skip_return=False)``, called with ``skip_export=True``: a shard runs through Data-Juicer's own
# ``RayExecutor``, but this package writes its rows (docs/lossless.md).

RAY_EXECUTOR_RUN: Final = f"{RAY_EXECUTOR_MODULE}.RayExecutor.run"
# keyword -> the default it must have (so that leaving it out keeps the dataset coming back)
RUN_KEYWORDS: Final = {"skip_export": False, "skip_return": False}


def _ray_executor_class() -> Any:
    executor = getattr(import_target(RAY_EXECUTOR_MODULE, where=RAY_EXECUTOR_RUN), "RayExecutor", None)
    run = getattr(executor, "run", None)
    if not callable(run):
        raise dj_moved(f"{RAY_EXECUTOR_RUN} is missing", where=RAY_EXECUTOR_RUN)
    parameters = inspect.signature(run).parameters
    for name, default in RUN_KEYWORDS.items():
        if name not in parameters or parameters[name].default is not default:
            raise dj_moved(
                f"{RAY_EXECUTOR_RUN} no longer takes {name}={default}: {tuple(parameters)}", where=RAY_EXECUTOR_RUN
            )
    return executor


def run_unexported(cfg: Any) -> Any:
    """``RayExecutor(cfg).run(skip_export=True)``: the processed dataset, nothing exported."""
    return _ray_executor_class()(cfg).run(skip_export=True)


def check_dj_ray_executor() -> str:
    _ray_executor_class()
    return f"{RAY_EXECUTOR_RUN}({', '.join(f'{k}={v}' for k, v in RUN_KEYWORDS.items())}) found"


# --- ``data_juicer.core.data.ray_dataset.RayDataset.read`` (a classmethod, the one call its Ray load
# strategy makes for a local JSONL path), swapped while a shard runs so that Data-Juicer gets the
# shard as this package read it (``execution.shard_reader``).

RAY_DATASET_MODULE: Final = "data_juicer.core.data.ray_dataset"
RAY_DATASET_READ: Final = f"{RAY_DATASET_MODULE}.RayDataset.read"


def ray_dataset_class() -> Any:
    try:
        from data_juicer.core.data.ray_dataset import RayDataset
    except ImportError as exc:
        raise dj_moved(f"cannot import {RAY_DATASET_MODULE}.RayDataset: {exc}") from exc
    return RayDataset


def read_method() -> classmethod:
    """``RayDataset.read`` as found on the class (a classmethod), or IntegrationError."""
    found = inspect.getattr_static(ray_dataset_class(), "read", None)
    if not isinstance(found, classmethod):
        raise dj_moved(f"{RAY_DATASET_READ} is missing or no longer a classmethod")
    return found


def replace_read(read: Callable[..., Any]) -> classmethod:
    """Make ``RayDataset.read`` call ``read(cls, data_format, paths, **kwargs)``; returns the
    original, for :func:`restore_read`."""
    original = read_method()
    ray_dataset_class().read = classmethod(functools.wraps(original.__func__)(read))
    return original


def restore_read(original: classmethod) -> None:
    ray_dataset_class().read = original


def check_dj_ray_dataset() -> str:
    parameters = tuple(inspect.signature(read_method().__func__).parameters)
    if parameters[:3] != ("cls", "data_format", "paths"):
        raise dj_moved(f"{RAY_DATASET_READ} no longer takes (data_format, paths): {parameters}")
    return f"{RAY_DATASET_READ}: classmethod (data_format, paths, ...) found"


# --- ``data_juicer.format.formatter.find_files_with_suffix``, the listing its ``LocalFormatter``
# (the default executor's local loader) reads a dataset directory in, wrapped so that a parts export
# is read in the order of its parts (docs/output-layouts.md): it lists in the filesystem's order
# (hash order on ext4).  Every other listing stays exactly as Data-Juicer makes it.

FORMATTER_MODULE: Final = "data_juicer.format.formatter"
FILE_LISTING: Final = f"{FORMATTER_MODULE}.find_files_with_suffix"

Listing = dict[str, list[str]]  # suffix -> files, as find_files_with_suffix returns them


def install_file_listing(formatter: ModuleType, reorder: Callable[[Any, Listing], Listing | None]) -> str:
    """Wrap the formatter module's ``find_files_with_suffix``: :data:`APPLIED`, :data:`ALREADY` or
    why the target is missing."""

    def make(original):
        def find_files_with_suffix(path, suffixes=None):
            found = original(path, suffixes)
            ordered = reorder(path, found)
            return found if ordered is None else ordered

        return find_files_with_suffix

    return wrap_function(formatter, "find_files_with_suffix", make, missing=f"{FILE_LISTING} not found")


def check_dj_file_listing() -> str:
    target_function(FORMATTER_MODULE, "find_files_with_suffix", parameters=("path", "suffixes"))
    local = getattr(import_target(FORMATTER_MODULE, where=FILE_LISTING), "LocalFormatter", None)
    if local is None:
        raise dj_moved(f"{FORMATTER_MODULE}.LocalFormatter is missing", where=FILE_LISTING)
    if "find_files_with_suffix(" not in inspect.getsource(local.__init__):
        raise dj_moved(
            f"{FORMATTER_MODULE}.LocalFormatter.__init__ no longer lists files with {FILE_LISTING}", where=FILE_LISTING
        )
    return f"{FILE_LISTING} found, called by LocalFormatter.__init__"


# --- ``data_juicer.utils.resource_utils.check_and_initialize_ray``, kept off while a recipe is
# parsed: with ``RAY_JOB=1`` the resource probes (``cpu_count`` in ``init_configs``) call
# ``ray.init(cfg.ray_address)``, attaching to any runtime on the node, which a worker parsing a shard
# recipe must not.  Only the CPU count changes (it clamps ``np``, never a Ray operator's arguments).

RESOURCE_MODULE: Final = "data_juicer.utils.resource_utils"
RAY_PROBE: Final = f"{RESOURCE_MODULE}.check_and_initialize_ray"
_NO_RAY_LOCK = threading.Lock()


def _resource_utils() -> Any:
    resource_utils = import_target(RESOURCE_MODULE, where=RAY_PROBE)
    if getattr(resource_utils, "check_and_initialize_ray", None) is None:
        raise dj_moved(f"{RAY_PROBE} is missing")
    return resource_utils


@contextlib.contextmanager
def no_ray_start() -> Iterator[None]:
    """Keep Data-Juicer's resource probes (``cpu_count`` in init_configs) off Ray."""
    resource_utils = _resource_utils()
    original = resource_utils.check_and_initialize_ray
    with _NO_RAY_LOCK:
        resource_utils.check_and_initialize_ray = lambda cfg=None: False
        try:
            yield
        finally:
            resource_utils.check_and_initialize_ray = original


def check_dj_resource_utils() -> str:
    _resource_utils()
    return f"{RAY_PROBE}: found"
