"""The patches that let unmodified ``dj-process`` / ``dj-analyze`` run ``executor_type: elastic_sharded``
(docs/architecture.md, "How does dj-process reach our executor?"): one ``patch_records.RECORDS`` entry
per target, whose mechanics are in its :mod:`data_juicer_elastic.compat` module, each applied when
Data-Juicer imports the target's module (``compat.importlib_deferred``).  The required ones carry
elastic_sharded; the others improve every executor's run (the configuration table to the log files
unless ``-v``, custom operators loaded once per process, a parts export read in order, no torch
install ``free_models`` does not need, ``adaptive_batching: true``).  A missing or changed target never
breaks Data-Juicer: it is recorded (``dj-elastic doctor`` shows it), the built-in executors keep
working, and every use of ``elastic_sharded`` fails with one IntegrationError naming it
(``patch_records.require_integration``).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from types import ModuleType

from data_juicer_elastic.batching import demo, mixin
from data_juicer_elastic.batching.mixin import check_config
from data_juicer_elastic.compat import dj_config_internals, dj_ops_internals
from data_juicer_elastic.compat import importlib_deferred as deferred
from data_juicer_elastic.compat.targets import wrap_function
from data_juicer_elastic.console import guard_file_sinks, install_console, quiet
from data_juicer_elastic.execution import dedup_ops
from data_juicer_elastic.integration import analysis_outputs, config_block, dispatch, driver_files
from data_juicer_elastic.integration.config_block import EXECUTOR_TYPE
from data_juicer_elastic.integration.patch_records import (
    ANALYZE_MAIN,
    ANALYZE_MODULE,
    BUILD_PARSER,
    CONFIG_MODULE,
    CREATE_EXECUTOR,
    DISPLAY_CONFIG,
    FACTORY_MODULE,
    FILE_LISTING,
    INIT_SETUP,
    LOAD_CUSTOM_OPS,
    OP_ERROR_HOOKS,
    OP_METACLASS,
    PROCESS_MAIN,
    PROCESS_MODULE,
    RECORDS,
    mark,
    record_install,
    require_integration,
)
from data_juicer_elastic.integration.recipe import check_dataset_path
from data_juicer_elastic.jobdir.exports import PARTS_INDEX, check_recipe_paths
from data_juicer_elastic.quarantine import collector

_install_lock = threading.Lock()
_installed = False


def install() -> None:
    """Register the deferred patches (idempotent; called by the entry point)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True

    deferred.when_imported(
        CONFIG_MODULE, _patch_config, _on_error(BUILD_PARSER, INIT_SETUP, DISPLAY_CONFIG, LOAD_CUSTOM_OPS)
    )
    patch_process = functools.partial(dispatch.patch_tool, record=PROCESS_MAIN, dispatch=True)
    patch_analyze = functools.partial(dispatch.patch_tool, record=ANALYZE_MAIN, dispatch=False)
    deferred.when_imported(PROCESS_MODULE, patch_process, _on_error(PROCESS_MAIN))
    deferred.when_imported(ANALYZE_MODULE, patch_analyze, _on_error(ANALYZE_MAIN))
    deferred.when_imported(FACTORY_MODULE, _patch_factory, _on_error(CREATE_EXECUTOR))
    deferred.when_imported(dj_ops_internals.BASE_OP, _patch_ops, _on_error(OP_METACLASS, OP_ERROR_HOOKS))
    deferred.when_imported(dj_ops_internals.FORMATTER_MODULE, _patch_listing, _on_error(FILE_LISTING))


def installed() -> bool:
    return _installed


def _on_error(*targets: str):
    def handler(_module_name: str, exc: BaseException) -> None:
        for target in targets:
            if RECORDS[target].state != "missing":
                mark(target, "missing", f"patching failed: {exc!r}")

    return handler


def _patch_config(module: ModuleType) -> None:
    hooks, alias = dj_config_internals, config_block.alias_parsed  # alias: the cfg kept for the one setup returns
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
    action = dj_config_internals.action_for(parser, "executor_type")
    if action is None or not action.choices:
        mark(BUILD_PARSER, "missing", "the parser it builds has no --executor_type choices")
    elif EXECUTOR_TYPE not in action.choices:
        action.choices = [*action.choices, EXECUTOR_TYPE]
        if action.help:
            action.help = f"{action.help} With data-juicer-elastic: {EXECUTOR_TYPE!r} (see the elastic.* options)."
    for each in dj_config_internals.actions(parser):
        dj_config_internals.name_converter(each)
    # elastic.num_shard: did you mean num_shards?
    dj_config_internals.amend_errors(parser, config_block.amend_parse_error)
    if not dj_config_internals.dests_starting(parser, "elastic."):
        config_block.add_elastic_arguments(parser)


def _prepare_elastic_setup(cfg) -> bool:
    """Before Data-Juicer's setup of any parsed cfg; True for an elastic one (see compat.dj_config_internals).

    Called once per init_configs, right after the final parse and before any side effect (work
    dir, logger, config backup): the place to refuse a bad elastic block and to keep the cfg as
    the user wrote it."""
    check_config(cfg)  # every executor: the adaptive-batching opt-in works (and is refused) everywhere
    # dj-analyze, any recipe: never over an elastic job's files
    if driver_files.parser_of() == driver_files.ANALYZER:
        analysis_outputs.refuse_overwrites(cfg)
    if not config_block.is_elastic(cfg):
        dispatch.before_setup(cfg)  # an ignored elastic: block is said before Data-Juicer's table
        return False
    require_integration()
    settings = config_block.settings_from_cfg(cfg)

    check_dataset_path(cfg)  # before Data-Juicer's setup warns it takes a missing path for a remote dataset
    # Where Data-Juicer's driver writes (the merged output, its logs and records): never inside
    # job_dir; checked before Data-Juicer creates its work dir.
    outputs = {key: cfg.get(key, None) for key in ("export_path", "work_dir", "event_log_dir", "checkpoint_dir")}
    check_recipe_paths(settings.job_dir, outputs, settings.export_layout)
    config_block.remember_parsed(cfg)
    if driver_files.parser_of() == driver_files.DRIVER:
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
    if not config_block.is_elastic(cfg) or quiet.verbose():
        return None
    return lambda table: quiet.log_only("Configuration table:\n" + table.rstrip("\n"))


def _elastic_setup_logger(real):
    """Data-Juicer's ``setup_logger`` for an elastic cfg: a sane log file name, then the plugin's
    console (``data_juicer_elastic.console``), which replaces its stderr sink right after, so
    nothing Data-Juicer logs from then on reaches the terminal unfiltered."""

    def console_and_guarded_logs() -> None:
        install_console()
        guard_file_sinks()  # its log files: a full export filesystem costs their lines, not a traceback a line

    return dj_config_internals.log_file_fixed(real, console_and_guarded_logs)


def _patch_ops(module: ModuleType) -> None:
    """``adaptive_batching: true`` applies AdaptiveBatchingMixin; the demo and dedup operators get registered."""
    dj_ops_internals.install_metaclass_hook(module, mixin.resolve)
    dj_ops_internals.install_error_hooks(
        module, collector.wrap_hook
    )  # quarantine under elastic_sharded; else unchanged
    mark(OP_ERROR_HOOKS, "applied")
    dj_ops_internals.install_free_models(module)  # no silent multi-GB torch install for operators that load no model
    demo.register()
    dedup_ops.register_dedup_ops()  # the deduplication phases' operators (docs/dedup.md)
    mark(OP_METACLASS, "applied")


def _patch_listing(module: ModuleType) -> None:
    record_install(FILE_LISTING, dj_ops_internals.install_file_listing(module, parts_order))


def parts_order(path, found: dict[str, list[str]]) -> dict[str, list[str]] | None:
    """A parts export's files in name order (its input order); None (Data-Juicer's own order) for
    anything that is not a directory holding a parts index."""
    directory = Path(path)
    if not directory.is_dir() or not (directory / PARTS_INDEX).is_file():
        return None
    return {suffix: sorted(files) for suffix, files in found.items()}


def _patch_factory(module: ModuleType) -> None:
    record_install(CREATE_EXECUTOR, dj_ops_internals.wrap_create_executor(module, _elastic_executor))


def _elastic_executor(executor_type):
    if executor_type != EXECUTOR_TYPE:
        return None
    require_integration()
    return dispatch.executor_class()
