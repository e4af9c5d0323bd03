"""The patches that let unmodified ``dj-process`` / ``dj-analyze`` run ``executor_type: elastic_sharded``.

Targets (all in py-data-juicer 1.6.x):

* ``data_juicer.config.config.build_base_parser``: accept ``elastic_sharded``
  as an ``--executor_type`` choice and add the typed ``--elastic.*`` options.
* ``data_juicer.config.config.init_setup_from_cfg``: for elastic recipes,
  validate the ``elastic:`` block and keep the cfg as parsed *before*
  Data-Juicer's setup mutates it, and keep the driver from starting Ray.
* ``data_juicer.tools.process_data.main``: dispatch elastic recipes to
  ``ElasticShardedExecutor`` (see :mod:`.dispatch`).
* ``data_juicer.tools.analyze_data.main``: the same error boundary, no dispatch.
* ``data_juicer.core.executor.factory.ExecutorFactory.create_executor``.
* ``data_juicer.ops.base_op.free_models`` (not needed by elastic_sharded): no torch install
  when no operator needs torch (:mod:`.lazy_installs`).
* ``data_juicer.config.config.display_config`` (not needed by elastic_sharded): an elastic
  job's configuration table goes to the log files unless ``-v``.
* ``data_juicer.ops.base_op.OPMetaClass.__call__`` (not needed by elastic_sharded):
  ``adaptive_batching: true`` gives the operator the AdaptiveBatchingMixin
  (:mod:`data_juicer_elastic.batching.optin`), and the demo operators register;
  ``init_setup_from_cfg`` also runs the adaptive-batching config checks for
  every executor type.

A missing or changed target never breaks Data-Juicer: it is recorded in
:data:`RECORDS`, the built-in executors keep working, and every use of
``elastic_sharded`` fails with one IntegrationError naming the internal
(:func:`require_integration`).  ``dj-elastic doctor`` shows the same records.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import threading
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Final, Literal

from data_juicer_elastic.errors import IntegrationError
from data_juicer_elastic.integration import deferred
from data_juicer_elastic.integration.config_block import (
    EXECUTOR_TYPE,
    add_elastic_arguments,
    alias_parsed,
    is_elastic,
    remember_parsed,
    settings_from_cfg,
)

SUPPORTED_DJ: Final = ">=1.6.1,<1.7"
CONFIG_MODULE: Final = "data_juicer.config.config"
PROCESS_MODULE: Final = "data_juicer.tools.process_data"
ANALYZE_MODULE: Final = "data_juicer.tools.analyze_data"
FACTORY_MODULE: Final = "data_juicer.core.executor.factory"

BUILD_PARSER: Final = f"{CONFIG_MODULE}.build_base_parser"
INIT_SETUP: Final = f"{CONFIG_MODULE}.init_setup_from_cfg"
DISPLAY_CONFIG: Final = f"{CONFIG_MODULE}.display_config"  # quiet console; not needed by elastic_sharded
PROCESS_MAIN: Final = f"{PROCESS_MODULE}.main"
ANALYZE_MAIN: Final = f"{ANALYZE_MODULE}.main"
CREATE_EXECUTOR: Final = f"{FACTORY_MODULE}.ExecutorFactory.create_executor"
BASE_OP_MODULE: Final = "data_juicer.ops.base_op"
# adaptive_batching opt-in (batching.optin) and the plugin's demo operators; not needed by elastic_sharded.
OP_METACLASS: Final = f"{BASE_OP_MODULE}.OPMetaClass.__call__"

# Marks a function we installed; its value is the function it wraps.
ORIGINAL: Final = "__dj_elastic_original__"
RAY_JOB_ENV: Final = "RAY_JOB"  # data_juicer.utils.constant.RAY_JOB_ENV_VAR, not imported on purpose

State = Literal["pending", "applied", "missing"]


@dataclass
class PatchRecord:
    target: str
    required: bool  # elastic_sharded is refused while a required patch is missing
    state: State = "pending"
    detail: str = ""


RECORDS: dict[str, PatchRecord] = {
    BUILD_PARSER: PatchRecord(BUILD_PARSER, required=True),
    INIT_SETUP: PatchRecord(INIT_SETUP, required=True),
    DISPLAY_CONFIG: PatchRecord(DISPLAY_CONFIG, required=False),
    PROCESS_MAIN: PatchRecord(PROCESS_MAIN, required=True),
    ANALYZE_MAIN: PatchRecord(ANALYZE_MAIN, required=False),
    CREATE_EXECUTOR: PatchRecord(CREATE_EXECUTOR, required=True),
    OP_METACLASS: PatchRecord(OP_METACLASS, required=False),
}

_install_lock = threading.Lock()
_installed = False


def install() -> None:
    """Register the deferred patches (idempotent; called by the entry point)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
    from data_juicer_elastic.integration import dispatch

    deferred.when_imported(CONFIG_MODULE, _patch_config, _on_error(BUILD_PARSER, INIT_SETUP, DISPLAY_CONFIG))
    patch_process = functools.partial(dispatch.patch_tool, record=PROCESS_MAIN, dispatch=True)
    patch_analyze = functools.partial(dispatch.patch_tool, record=ANALYZE_MAIN, dispatch=False)
    deferred.when_imported(PROCESS_MODULE, patch_process, _on_error(PROCESS_MAIN))
    deferred.when_imported(ANALYZE_MODULE, patch_analyze, _on_error(ANALYZE_MAIN))
    deferred.when_imported(FACTORY_MODULE, _patch_factory, _on_error(CREATE_EXECUTOR))
    deferred.when_imported(BASE_OP_MODULE, _patch_ops, _on_error(OP_METACLASS))


def installed() -> bool:
    return _installed


# --- records -------------------------------------------------------------------------------------


def mark(target: str, state: State, detail: str = "") -> None:
    record = RECORDS[target]
    # A later "applied" must not hide an earlier problem found for the same target.
    if record.state == "missing" and state == "applied":
        return
    record.state, record.detail = state, detail


def problems() -> list[PatchRecord]:
    return [r for r in RECORDS.values() if r.state == "missing"]


def require_integration() -> None:
    """Raise one IntegrationError if a Data-Juicer internal needed by elastic_sharded is missing."""
    missing = [r for r in problems() if r.required]
    if not missing:
        return
    first, others = missing[0], missing[1:]
    message = (
        f"{first.detail} in Data-Juicer {dj_version() or '(unknown version)'}; "
        f"executor_type {EXECUTOR_TYPE} hooks into it"
    )
    if others:
        message += "; also " + "; ".join(f"{r.target}: {r.detail}" for r in others)
    raise IntegrationError(
        message,
        where=missing[0].target,
        hint=f"install py-data-juicer{SUPPORTED_DJ} or a data-juicer-elastic release that supports it; "
        "the built-in executors still work; run `dj-elastic doctor` for details",
    )


def dj_version() -> str | None:
    try:
        return metadata.version("py-data-juicer")
    except metadata.PackageNotFoundError:
        return None


def _on_error(*targets: str):
    def handler(_module_name: str, exc: BaseException) -> None:
        for target in targets:
            if RECORDS[target].state != "missing":
                mark(target, "missing", f"patching failed: {exc!r}")

    return handler


def wrapped(function) -> bool:
    return getattr(function, ORIGINAL, None) is not None


# --- data_juicer.config.config -------------------------------------------------------------------


def _patch_config(module: ModuleType) -> None:
    for name, record, wrap in (
        ("build_base_parser", BUILD_PARSER, _wrap_build_base_parser),
        ("init_setup_from_cfg", INIT_SETUP, _wrap_init_setup),
        ("display_config", DISPLAY_CONFIG, _wrap_display_config),
    ):
        original = getattr(module, name, None)
        if not callable(original):
            mark(record, "missing", "function not found")
        elif not wrapped(original):
            setattr(module, name, wrap(original))
            mark(record, "applied")


def _wrap_build_base_parser(original):
    @functools.wraps(original)
    def build_base_parser(*args, **kwargs):
        parser = original(*args, **kwargs)
        extend_parser(parser)
        return parser

    setattr(build_base_parser, ORIGINAL, original)
    return build_base_parser


def extend_parser(parser) -> None:
    """Add elastic_sharded to --executor_type's choices and the --elastic.* options."""
    action = next((a for a in getattr(parser, "_actions", ()) if getattr(a, "dest", None) == "executor_type"), None)
    if action is None or not action.choices:
        mark(BUILD_PARSER, "missing", "the parser it builds has no --executor_type choices")
    elif EXECUTOR_TYPE not in action.choices:
        action.choices = [*action.choices, EXECUTOR_TYPE]
        if action.help:
            action.help = f"{action.help} With data-juicer-elastic: {EXECUTOR_TYPE!r} (see the elastic.* options)."
    for each in getattr(parser, "_actions", ()):
        _name_converter(each)
    if not any(getattr(a, "dest", "").startswith("elastic.") for a in parser._actions):
        add_elastic_arguments(parser)


def _name_converter(action) -> None:
    """Help text only: jsonargparse wraps a ``type`` given with ``choices`` (``executor_type``,
    ``checkpoint.strategy``...) in a lambda, and ``--help`` prints that lambda's repr as the
    type (``<function <locals>.<lambda> at 0x...>``); name it after the type it converts to."""
    convert = getattr(action, "type", None)
    code = getattr(convert, "__code__", None)
    if code is None or getattr(convert, "__name__", "") != "<lambda>" or "typehint" not in code.co_freevars:
        return
    typehint = convert.__closure__[code.co_freevars.index("typehint")].cell_contents
    action.type = _NamedType(convert, getattr(typehint, "__name__", None) or str(typehint))


class _NamedType:
    """jsonargparse wraps ``type=str`` with ``choices`` in a lambda, and its ``--help`` prints that
    lambda's repr as the type (``<function <locals>.<lambda> at 0x...>``); this wrapper converts
    exactly as before and shows as the type it converts to."""

    def __init__(self, convert, name: str):
        self.convert, self.name = convert, name

    def __call__(self, value):
        return self.convert(value)

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


def _wrap_init_setup(original):
    @functools.wraps(original)
    def init_setup_from_cfg(cfg, *args, **kwargs):
        check_adaptive_batching(cfg)  # every executor: the opt-in works (and is refused) everywhere
        if not is_elastic(cfg):
            return original(cfg, *args, **kwargs)
        # Called once per init_configs, right after the final parse and before
        # any side effect (work dir, logger, config backup): the place to refuse
        # a bad elastic block and to keep the cfg as the user wrote it.
        require_integration()
        settings = settings_from_cfg(cfg)
        check_output_paths(cfg, settings.job_dir)  # before Data-Juicer creates its work dir (maybe in job_dir)
        remember_parsed(cfg)
        if cfg.get("elastic_juicer_adaptive_batching", False):
            # Data-Juicer allows adaptive batching only for Ray executors.  The
            # driver runs no operator; the shard recipe (built from the kept
            # copy) carries the flag to the Ray executor in each worker.
            cfg.elastic_juicer_adaptive_batching = False
        # RAY_JOB=1 in the driver's environment would make the CPU-count check
        # start a Ray runtime here; the driver must not own one.
        ray_job = os.environ.pop(RAY_JOB_ENV, None)
        module = inspect.getmodule(original)
        real_setup_logger = getattr(module, "setup_logger", None)
        if callable(real_setup_logger):
            module.setup_logger = _elastic_setup_logger(real_setup_logger)
        try:
            result = original(cfg, *args, **kwargs)
        finally:
            if ray_job is not None:
                os.environ[RAY_JOB_ENV] = ray_job
            if callable(real_setup_logger):
                module.setup_logger = real_setup_logger
        if result is not cfg:
            alias_parsed(result, cfg)
        return result

    setattr(init_setup_from_cfg, ORIGINAL, original)
    return init_setup_from_cfg


# Where Data-Juicer's driver writes (the merged output, its logs and records): never inside job_dir.
OUTPUT_KEYS: Final = ("export_path", "work_dir", "event_log_dir", "checkpoint_dir")


def check_output_paths(cfg, job_dir: str) -> None:
    from data_juicer_elastic.jobdir.export_path import check_recipe_paths

    check_recipe_paths(job_dir, {key: cfg.get(key, None) for key in OUTPUT_KEYS})


def _wrap_display_config(original):
    """Quiet (the default), an elastic job's ~300-line configuration table goes to the log
    files only: printed on the console, it buried the plugin's own lines and put any refusal
    of the recipe or input below it.  ``-v`` prints it as before."""

    @functools.wraps(original)
    def display_config(cfg, *args, **kwargs):
        from data_juicer_elastic.console import quiet

        if not is_elastic(cfg) or quiet.verbose():
            return original(cfg, *args, **kwargs)
        table = io.StringIO()
        with contextlib.redirect_stdout(table):  # Data-Juicer prints the table itself
            result = original(cfg, *args, **kwargs)
        quiet.log_only("Configuration table:\n" + table.getvalue().rstrip("\n"))
        return result

    setattr(display_config, ORIGINAL, original)
    return display_config


def _elastic_setup_logger(real):
    """Data-Juicer's ``setup_logger`` for an elastic cfg: a sane log file name, then the plugin's console.

    Data-Juicer names the log ``export_<export_path relative to work_dir>_time_<t>.txt``, but
    its work dir is ``dirname(export_path)/<job_id>``, so that relative path is
    ``../merged.jsonl`` and the file lands in a folder literally named ``logs/export_..``.
    The console (``data_juicer_elastic.console``) replaces its stderr sink right after, so
    nothing Data-Juicer logs from then on reaches the terminal unfiltered.
    """

    @functools.wraps(real)
    def setup_logger(*args, **kwargs):
        filename = kwargs.get("filename")
        if isinstance(filename, str) and filename.startswith(f"export_..{os.sep}"):
            kwargs["filename"] = "export_" + os.path.basename(filename[len("export_") :])
        real(*args, **kwargs)
        from data_juicer_elastic.console import install_console

        install_console()

    return setup_logger


def check_adaptive_batching(cfg) -> None:
    from data_juicer_elastic.batching.optin import check_config

    check_config(cfg)


# --- data_juicer.ops.base_op ---------------------------------------------------------------------


def _patch_ops(module: ModuleType) -> None:
    """``adaptive_batching: true`` applies AdaptiveBatchingMixin; the demo operators get registered."""
    import importlib

    from data_juicer_elastic.batching import optin
    from data_juicer_elastic.integration.lazy_installs import patch_free_models

    optin.install(module)
    patch_free_models(module)  # no silent multi-GB torch install for operators that load no model
    # Registers at import; a Ray worker that unpickles a demo operator may be importing it right now.
    importlib.import_module("data_juicer_elastic.batching.demo")
    mark(OP_METACLASS, "applied")


# --- data_juicer.core.executor.factory -----------------------------------------------------------


def _patch_factory(module: ModuleType) -> None:
    factory = getattr(module, "ExecutorFactory", None)
    raw = inspect.getattr_static(factory, "create_executor", None) if factory is not None else None
    if not isinstance(raw, (staticmethod, classmethod)):
        mark(CREATE_EXECUTOR, "missing", "not found" if raw is None else "no longer a static/class method")
        return
    original = raw.__func__
    if wrapped(original):
        return
    is_static = isinstance(raw, staticmethod)

    @functools.wraps(original)
    def create_executor(*args, **kwargs):
        positional = args if is_static else args[1:]
        executor_type = kwargs.get("executor_type", positional[0] if positional else None)
        if executor_type == EXECUTOR_TYPE:
            require_integration()
            return executor_class()
        return original(*args, **kwargs)

    setattr(create_executor, ORIGINAL, original)
    factory.create_executor = staticmethod(create_executor) if is_static else classmethod(create_executor)
    mark(CREATE_EXECUTOR, "applied")


def executor_class():
    """``ElasticShardedExecutor``, imported only when an elastic recipe runs."""
    from data_juicer_elastic.executor import ElasticShardedExecutor

    return ElasticShardedExecutor
