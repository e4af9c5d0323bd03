"""The patches that let unmodified ``dj-process`` / ``dj-analyze`` run ``executor_type: elastic_sharded``
(docs/architecture.md, "How does dj-process reach our executor?"): one :data:`RECORDS` entry per
target, whose mechanics are in its :mod:`data_juicer_elastic.compat` module, each applied when
Data-Juicer imports the target's module (``compat.importlib_deferred``).  The required ones carry
elastic_sharded; the others improve every executor's run (the configuration table to the log files
unless ``-v``, custom operators loaded once per process, a parts export read in order, no torch
install ``free_models`` does not need, ``adaptive_batching: true``).  A missing or changed target never
breaks Data-Juicer: it is recorded (``dj-elastic doctor`` shows it), the built-in executors keep
working, and every use of ``elastic_sharded`` fails with one IntegrationError naming it
(:func:`require_integration`).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Final, Literal

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.compat import (
    ALREADY,
    APPLIED,
    dj_config_module,
    dj_executor_factory,
    dj_file_listing,
    dj_free_models,
    dj_op_error_hooks,
    dj_op_metaclass,
    dj_tool_main,
    jsonargparse_actions,
    wrap_function,
)
from data_juicer_elastic.compat import importlib_deferred as deferred
from data_juicer_elastic.errors import IntegrationError
from data_juicer_elastic.integration import analysis_outputs, config_block, driver_files
from data_juicer_elastic.integration.config_block import EXECUTOR_TYPE
from data_juicer_elastic.jobdir.export_path import PARTS_INDEX

CONFIG_MODULE: Final = dj_config_module.MODULE
PROCESS_MODULE: Final = dj_tool_main.PROCESS_MODULE
ANALYZE_MODULE: Final = dj_tool_main.ANALYZE_MODULE
FACTORY_MODULE: Final = dj_executor_factory.MODULE

BUILD_PARSER: Final = f"{CONFIG_MODULE}.build_base_parser"
INIT_SETUP: Final = f"{CONFIG_MODULE}.init_setup_from_cfg"
DISPLAY_CONFIG: Final = f"{CONFIG_MODULE}.display_config"
LOAD_CUSTOM_OPS: Final = f"{CONFIG_MODULE}.load_custom_operators"
PROCESS_MAIN: Final = f"{PROCESS_MODULE}.main"
ANALYZE_MAIN: Final = f"{ANALYZE_MODULE}.main"
CREATE_EXECUTOR: Final = dj_executor_factory.TARGET
OP_METACLASS: Final = dj_op_metaclass.TARGET
OP_ERROR_HOOKS: Final = dj_op_error_hooks.TARGET  # required: without it an operator error drops rows silently
FILE_LISTING: Final = dj_file_listing.TARGET

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
    LOAD_CUSTOM_OPS: PatchRecord(LOAD_CUSTOM_OPS, required=False),
    PROCESS_MAIN: PatchRecord(PROCESS_MAIN, required=True),
    ANALYZE_MAIN: PatchRecord(ANALYZE_MAIN, required=False),
    CREATE_EXECUTOR: PatchRecord(CREATE_EXECUTOR, required=True),
    OP_METACLASS: PatchRecord(OP_METACLASS, required=False),
    OP_ERROR_HOOKS: PatchRecord(OP_ERROR_HOOKS, required=True),
    FILE_LISTING: PatchRecord(FILE_LISTING, required=False),
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

    deferred.when_imported(
        CONFIG_MODULE, _patch_config, _on_error(BUILD_PARSER, INIT_SETUP, DISPLAY_CONFIG, LOAD_CUSTOM_OPS)
    )
    patch_process = functools.partial(dispatch.patch_tool, record=PROCESS_MAIN, dispatch=True)
    patch_analyze = functools.partial(dispatch.patch_tool, record=ANALYZE_MAIN, dispatch=False)
    deferred.when_imported(PROCESS_MODULE, patch_process, _on_error(PROCESS_MAIN))
    deferred.when_imported(ANALYZE_MODULE, patch_analyze, _on_error(ANALYZE_MAIN))
    deferred.when_imported(FACTORY_MODULE, _patch_factory, _on_error(CREATE_EXECUTOR))
    deferred.when_imported(dj_op_metaclass.MODULE, _patch_ops, _on_error(OP_METACLASS, OP_ERROR_HOOKS))
    deferred.when_imported(dj_file_listing.MODULE, _patch_listing, _on_error(FILE_LISTING))


def installed() -> bool:
    return _installed


def mark(target: str, state: State, detail: str = "") -> None:
    record = RECORDS[target]
    # A later "applied" must not hide an earlier problem found for the same target.
    if record.state == "missing" and state == "applied":
        return
    record.state, record.detail = state, detail


def record_install(target: str, outcome: str) -> None:
    """Record what a compat ``wrap_*`` returned: applied, already installed (nothing new), or why not."""
    if outcome == APPLIED:
        mark(target, "applied")
    elif outcome != ALREADY:
        mark(target, "missing", outcome)


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
        hint=f"install {DATA_JUICER_REQUIREMENT} or a data-juicer-elastic release that supports it; "
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


def _patch_config(module: ModuleType) -> None:
    hooks, alias = dj_config_module, config_block.alias_parsed  # alias: the cfg kept for the one setup returns
    setup = functools.partial(hooks.wrap_init_setup, _prepare_elastic_setup, _elastic_setup_logger, alias)
    for name, record, make in (
        ("build_base_parser", BUILD_PARSER, functools.partial(hooks.wrap_build_base_parser, extend_parser)),
        ("init_setup_from_cfg", INIT_SETUP, setup),
        ("display_config", DISPLAY_CONFIG, functools.partial(hooks.wrap_display_config, _config_table_log)),
        ("load_custom_operators", LOAD_CUSTOM_OPS, hooks.wrap_load_custom_operators),
    ):
        record_install(record, wrap_function(module, name, make))


def extend_parser(parser) -> None:
    """Add elastic_sharded to --executor_type's choices and the --elastic.* options."""
    action = jsonargparse_actions.action_for(parser, "executor_type")
    if action is None or not action.choices:
        mark(BUILD_PARSER, "missing", "the parser it builds has no --executor_type choices")
    elif EXECUTOR_TYPE not in action.choices:
        action.choices = [*action.choices, EXECUTOR_TYPE]
        if action.help:
            action.help = f"{action.help} With data-juicer-elastic: {EXECUTOR_TYPE!r} (see the elastic.* options)."
    for each in jsonargparse_actions.actions(parser):
        jsonargparse_actions.name_converter(each)
    # elastic.num_shard: did you mean num_shards?
    jsonargparse_actions.amend_errors(parser, config_block.amend_parse_error)
    if not jsonargparse_actions.dests_starting(parser, "elastic."):
        config_block.add_elastic_arguments(parser)


def _prepare_elastic_setup(cfg) -> bool:
    """Before Data-Juicer's setup of any parsed cfg; True for an elastic one (see compat.dj_config_module).

    Called once per init_configs, right after the final parse and before any side effect (work
    dir, logger, config backup): the place to refuse a bad elastic block and to keep the cfg as
    the user wrote it."""
    from data_juicer_elastic.batching.optin import check_config
    from data_juicer_elastic.jobdir.export_path import check_recipe_paths

    check_config(cfg)  # every executor: the adaptive-batching opt-in works (and is refused) everywhere
    if analysis_outputs.is_analysing():  # dj-analyze, any recipe: never over an elastic job's files
        analysis_outputs.refuse_overwrites(cfg)
    if not config_block.is_elastic(cfg):
        from data_juicer_elastic.integration import dispatch  # imports this module: not at the top

        dispatch.before_setup(cfg)  # an ignored elastic: block is said before Data-Juicer's table
        return False
    require_integration()
    settings = config_block.settings_from_cfg(cfg)
    from data_juicer_elastic.preparation import check_dataset_path  # the job's modules load only for an elastic cfg

    check_dataset_path(cfg)  # before Data-Juicer's setup warns it takes a missing path for a remote dataset
    # Where Data-Juicer's driver writes (the merged output, its logs and records): never inside
    # job_dir; checked before Data-Juicer creates its work dir.
    outputs = {key: cfg.get(key, None) for key in ("export_path", "work_dir", "event_log_dir", "checkpoint_dir")}
    check_recipe_paths(settings.job_dir, outputs, settings.export_layout)
    config_block.remember_parsed(cfg)
    if driver_files.is_driving():
        driver_files.note_job_dir(settings.job_dir)  # before anything is written: a refusal removes what we made
        driver_files.place_work_dir(cfg, settings.job_dir)  # Data-Juicer's work dir: under the job's logs
    if cfg.get("elastic_juicer_adaptive_batching", False):
        # Data-Juicer allows adaptive batching only for Ray executors.  The driver runs no
        # operator; the shard recipe (built from the kept copy) carries the flag to the workers.
        cfg.elastic_juicer_adaptive_batching = False
    return True


def _config_table_log(cfg):
    """Quiet (the default), an elastic job's ~300-line configuration table goes to the log files
    only: on the console it would bury the plugin's own lines and put any refusal of the recipe or
    input below it.  ``-v`` prints it on the console."""
    from data_juicer_elastic.console import quiet

    if not config_block.is_elastic(cfg) or quiet.verbose():
        return None
    return lambda table: quiet.log_only("Configuration table:\n" + table.rstrip("\n"))


def _elastic_setup_logger(real):
    """Data-Juicer's ``setup_logger`` for an elastic cfg: a sane log file name, then the plugin's
    console (``data_juicer_elastic.console``), which replaces its stderr sink right after, so
    nothing Data-Juicer logs from then on reaches the terminal unfiltered."""

    def install_console() -> None:
        from data_juicer_elastic.console import guard_file_sinks, install_console

        install_console()
        guard_file_sinks()  # its log files: a full export filesystem costs their lines, not a traceback a line

    return dj_config_module.log_file_fixed(real, install_console)


def _patch_ops(module: ModuleType) -> None:
    """``adaptive_batching: true`` applies AdaptiveBatchingMixin; the demo operators get registered."""
    from data_juicer_elastic.batching import demo, optin
    from data_juicer_elastic.quarantine import collector

    dj_op_metaclass.install(module, optin.resolve)
    dj_op_error_hooks.install(module, collector.wrap_hook)  # quarantine under elastic_sharded; else unchanged
    mark(OP_ERROR_HOOKS, "applied")
    dj_free_models.install(module)  # no silent multi-GB torch install for operators that load no model
    demo.register()
    mark(OP_METACLASS, "applied")


def _patch_listing(module: ModuleType) -> None:
    record_install(FILE_LISTING, dj_file_listing.install(module, parts_order))


def parts_order(path, found: dict[str, list[str]]) -> dict[str, list[str]] | None:
    """A parts export's files in name order (its input order); None (Data-Juicer's own order) for
    anything that is not a directory holding a parts index."""
    directory = Path(path)
    if not directory.is_dir() or not (directory / PARTS_INDEX).is_file():
        return None
    return {suffix: sorted(files) for suffix, files in found.items()}


def _patch_factory(module: ModuleType) -> None:
    record_install(CREATE_EXECUTOR, dj_executor_factory.wrap_create_executor(module, _elastic_executor))


def _elastic_executor(executor_type):
    if executor_type != EXECUTOR_TYPE:
        return None
    require_integration()
    return executor_class()


def executor_class():
    """``ElasticShardedExecutor``, imported only when an elastic recipe runs."""
    from data_juicer_elastic.executor import ElasticShardedExecutor

    return ElasticShardedExecutor
