"""``dj-process`` / ``dj-analyze`` mains: ``elastic_sharded`` dispatched to our executor, an
ElasticError as one line on stderr with exit code 2 and no traceback (docs/architecture.md, "How
does dj-process reach our executor?"; ``dj-analyze`` of an elastic job's output: docs/analysis.md;
its parse runs under ``driver_files.parsing(ANALYZER)``, so that it never writes over the job's files).
``python -m data_juicer.tools.process_data`` runs the tool as ``__main__``, which the wrapper does
not reach: Data-Juicer's own main then rejects ``elastic_sharded``.  Use ``dj-process``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from data_juicer_elastic.compat import dj_config_internals
from data_juicer_elastic.console.log_files import close_log_sinks
from data_juicer_elastic.console.quiet import mark_quiet_workers
from data_juicer_elastic.console.summary import print_summary
from data_juicer_elastic.errors import DispatchAbort, DispatchToElastic, ElasticError, Places, storage_error
from data_juicer_elastic.integration import driver_files, patch_records
from data_juicer_elastic.integration.config_block import (
    EXECUTOR_TYPE,
    cfg_value,
    given_block,
    is_elastic,
    settings_from_cfg,
)
from data_juicer_elastic.jobdir.exports import merge_places
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

PROGS = {patch_records.PROCESS_MAIN: "dj-process", patch_records.ANALYZE_MAIN: "dj-analyze"}
# The dj-process run in this thread: whether it dispatches, and the ignored block's warning once given.
_run = threading.local()


def patch_tool(module: ModuleType, *, record: str, dispatch: bool) -> None:
    call = functools.partial(run_tool, module, prog=PROGS.get(record, record), dispatch=dispatch)
    patch_records.record_install(record, dj_config_internals.wrap_main(module, call))


def run_tool(module: ModuleType, original, args, kwargs, *, prog: str, dispatch: bool):
    if patch_records.problems() and requests_elastic(sys.argv[1:]):
        # Without a patched parser Data-Juicer would only say "invalid choice".
        try:
            patch_records.require_integration()
        except ElasticError as err:
            fail(prog, err)

    def carrying(real_init_configs):
        def init_configs(*a, **k):
            try:
                cfg = real_init_configs(*a, **k)
            except ElasticError as err:
                raise DispatchAbort(err) from None
            except OSError as exc:  # Data-Juicer's set-up wrote into a full or read-only work dir
                load = functools.cache(_recipe)  # each --config file parsed once for both looks
                if not (dispatch and requests_elastic(sys.argv[1:], load=load)):
                    raise  # a built-in executor's run: Data-Juicer's own behaviour
                places = recipe_places(sys.argv[1:], load=load)
                raise DispatchAbort(storage_error(exc, "Data-Juicer's work dir", "run it again", places)) from None
            if dispatch and is_elastic(cfg):
                raise DispatchToElastic(EXECUTOR_TYPE, cfg)
            return cfg

        return init_configs

    _run.dispatching, _run.ignored_block = dispatch, None
    try:
        with driver_files.parsing(driver_files.DRIVER if dispatch else driver_files.ANALYZER):
            with dj_config_internals.init_configs_replaced(module, carrying):
                result = original(*args, **kwargs)
        if _run.ignored_block:  # again at the end of the default executor's run: its last lines
            from loguru import logger

            logger.warning(_run.ignored_block)
        return result
    except DispatchToElastic as carried:
        cfg = carried.cfg
    except DispatchAbort as carried:
        fail(prog, carried.error)
    finally:
        _run.dispatching = False

    try:
        run_elastic(cfg)
    except ElasticError as err:
        fail(prog, err)
    except OSError as exc:  # a filesystem that refused a write no step turned into its own error
        fail(prog, storage_error(exc, "", "run it again", places=job_places(cfg)))
    return None


def before_setup(cfg: Any) -> None:
    """Data-Juicer's setup of a parsed cfg that is not elastic is about to start (its ~300-line
    configuration table follows): the ignored block's warning goes first, where it is seen."""
    if getattr(_run, "dispatching", False):
        _run.ignored_block = warn_ignored_block(cfg, sys.argv[1:])


def warn_ignored_block(cfg: Any, argv: Sequence[str]) -> str | None:
    """A warning when a recipe sets ``elastic.*`` but not ``executor_type: elastic_sharded``:
    Data-Juicer's own executor runs it and the block does nothing, which nothing else says.
    Not when the command line or the environment chose the executor (a deliberate comparison).
    Returns what it said (``run_tool`` says it again once the run ends), None when silent."""
    given = given_block(cfg)
    chosen = os.environ.get("DJ_PROCESS_EXECUTOR_TYPE") or _option_values(argv, "--executor_type")
    if not given or chosen:
        return None
    from loguru import logger

    executor = cfg_value(cfg, "executor_type")
    message = (
        f"the recipe sets {', '.join(given[:3])}{', ...' if len(given) > 3 else ''} but its executor_type is "
        f"{executor!r}: Data-Juicer's {executor} executor runs it and ignores the elastic: block (no shards, no "
        f"job directory). To run it sharded, add `executor_type: {EXECUTOR_TYPE}` to the recipe."
    )
    logger.warning(message)
    return message


def job_places(cfg: Any) -> Places:
    """The job directory and the export location of an elastic cfg (for a storage error's hint)."""
    try:
        job_dir, export = settings_from_cfg(cfg).job_dir, cfg.get("export_path", None)
    except (ElasticError, AttributeError, TypeError):
        return ()
    return merge_places(job_dir, export) if job_dir and export else ()


def run_elastic(cfg: Any) -> None:
    patch_records.require_integration()
    mark_quiet_workers()
    executor = executor_class()(cfg)
    print_run_summary(executor, executor.run())


def executor_class():
    """``ElasticShardedExecutor``, imported only when an elastic recipe runs: it loads Data-Juicer,
    which a plain ``dj-process`` run and the patches' installation never need from us."""
    from data_juicer_elastic.executor import ElasticShardedExecutor

    return ElasticShardedExecutor


def print_run_summary(executor: Any, result: Any) -> None:
    """The run's summary, naming this node's instance logs (``<job_dir>/logs/<node>/``); nothing when
    ``result`` is None: this instance stopped at max_shards, the others finish the run."""
    if result is None:
        return

    job_dir = executor.settings.job_dir
    logs = JobLayout(Path(os.path.abspath(job_dir))).node_log_dir(WorkerIdentity.current().node_id)
    print_summary(job_dir, result, log_path=f"{logs}{os.sep}")


def fail(prog: str, err: ElasticError) -> NoReturn:
    """One readable line on stderr, the last one, then the error's exit code (2)."""
    close_log_sinks()
    driver_files.remove_refused_job_dirs()  # a job dir this refused run created, nothing run in it
    sys.stdout.flush()
    print(f"{prog}: error: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
    sys.exit(err.exit_code)


def driving_elastic() -> bool:
    """This process is ``dj-process`` and its command line asks for elastic_sharded (cheap look)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") == PROGS[patch_records.PROCESS_MAIN] and requests_elastic(
        sys.argv[1:]
    )


def requests_elastic(argv: Sequence[str], *, load: Callable[[str], Any] | None = None) -> bool:
    """Cheap look at argv, env and the --config file for executor_type elastic_sharded (where a
    patch is missing the parser may reject the choice before the plugin could explain why)."""
    if EXECUTOR_TYPE in (os.environ.get("DJ_PROCESS_EXECUTOR_TYPE"), *_option_values(argv, "--executor_type")):
        return True
    for path in _option_values(argv, "--config"):
        data = (load or _recipe)(path)
        if isinstance(data, dict) and data.get("executor_type") == EXECUTOR_TYPE:
            return True
    return False


def recipe_places(argv: Sequence[str], *, load: Callable[[str], Any] | None = None) -> Places:
    """The job directory and the export location named by the ``--config`` file (for a storage
    error raised before Data-Juicer's parse returned a cfg); () when unsure."""
    for path in _option_values(argv, "--config"):
        data = (load or _recipe)(path)
        block = data.get("elastic") if isinstance(data, dict) else None
        if isinstance(block, dict) and block.get("job_dir") and data.get("export_path"):
            return merge_places(str(block["job_dir"]), str(data["export_path"]))
    return ()


def _option_values(argv: Sequence[str], option: str) -> list[str]:
    """The values given as ``<option> X`` or ``<option>=X``, in order."""
    argv = list(argv)
    return [
        argv[i + 1] if arg == option else arg.partition("=")[2]
        for i, arg in enumerate(argv)
        if (arg == option and i + 1 < len(argv)) or arg.startswith(f"{option}=")
    ]


def _recipe(path: str) -> Any:
    try:
        import yaml

        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except Exception:  # unreadable here means Data-Juicer reports it itself
        return None
