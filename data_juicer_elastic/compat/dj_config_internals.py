"""Data-Juicer's configuration (py-data-juicer 1.6.1): its parser, its setup of a parsed config,
its tools' ``main`` and the globals a shard run swaps; Data-Juicer has no executor plugin interface
(``integration.patches`` decides what each hook does, this module how it reaches the target).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat.targets import dj_moved, import_target, target_function, wrap_function
from data_juicer_elastic.errors import IntegrationError, RecipeError

# --- data_juicer.config.config, where a parsed config can be accepted, checked and kept before its
# setup mutates it.  Wrapped: ``build_base_parser``, ``init_setup_from_cfg`` (an elastic cfg runs
# without ``RAY_JOB``, whose CPU-count probe would start Ray in the driver, and with ``setup_logger``
# replaced), ``display_config`` (it prints on stdout) and ``load_custom_operators`` (through the
# plugin's loader: each path once per process, a broken one is one error, docs/failure-semantics.md
# row 34).  Called: ``resolve_job_id`` / ``resolve_job_directories`` and ``global_cfg`` to re-base a
# shard config, and the loader itself, with the ``sys.modules`` entries it makes (named after each
# file or folder).

CONFIG_MODULE: Final = "data_juicer.config.config"
WRAPPED: Final = ("build_base_parser", "init_setup_from_cfg", "display_config")
CALLED: Final = ("resolve_job_id", "resolve_job_directories", "load_custom_operators")
RAY_JOB_ENV: Final = "RAY_JOB"  # data_juicer.utils.constant.RAY_JOB_ENV_VAR, not imported on purpose


def wrap_build_base_parser(extend: Callable[[Any], None], original: Any) -> Callable[..., Any]:
    """``build_base_parser`` that passes the parser it built to ``extend``."""

    def build_base_parser(*args, **kwargs):
        parser = original(*args, **kwargs)
        extend(parser)
        return parser

    return build_base_parser


def wrap_init_setup(
    prepare: Callable[[Any], bool],
    setup_logger: Callable[[Any], Any],
    finish: Callable[[Any, Any], None],
    original: Any,
) -> Callable[..., Any]:
    """``init_setup_from_cfg`` that calls ``prepare(cfg)`` first; when it returns True (an elastic
    cfg), runs the original without ``RAY_JOB`` and with ``setup_logger(real setup_logger)``, then
    ``finish(result, cfg)``."""

    def init_setup_from_cfg(cfg, *args, **kwargs):
        if not prepare(cfg):
            return original(cfg, *args, **kwargs)
        # RAY_JOB=1 in the driver's environment would make the CPU-count check
        # start a Ray runtime here; the driver must not own one.
        ray_job = os.environ.pop(RAY_JOB_ENV, None)
        module = inspect.getmodule(original)
        real_setup_logger = getattr(module, "setup_logger", None)
        if callable(real_setup_logger):
            module.setup_logger = setup_logger(real_setup_logger)
        try:
            result = original(cfg, *args, **kwargs)
        finally:
            if ray_job is not None:
                os.environ[RAY_JOB_ENV] = ray_job
            if callable(real_setup_logger):
                module.setup_logger = real_setup_logger
        finish(result, cfg)
        return result

    return init_setup_from_cfg


def log_file_fixed(real: Any, after: Callable[[], None]) -> Any:
    """Data-Juicer's ``setup_logger`` with a sane log file name, then ``after()``.

    Data-Juicer names the log ``export_<export_path relative to work_dir>_time_<t>.txt``, but
    for an elastic job its work dir is ``dirname(export_path)/<job_id>``, so that relative path
    is ``../merged.jsonl`` and the file lands in a folder literally named ``logs/export_..``.
    """

    @functools.wraps(real)
    def setup_logger(*args, **kwargs):
        filename = kwargs.get("filename")
        if isinstance(filename, str) and filename.startswith(f"export_..{os.sep}"):
            kwargs["filename"] = "export_" + os.path.basename(filename[len("export_") :])
        real(*args, **kwargs)
        after()

    return setup_logger


def wrap_display_config(log_only: Callable[[Any], Callable[[str], None] | None], original: Any) -> Callable[..., Any]:
    """``display_config`` whose table (printed on stdout) goes to ``log_only(cfg)`` (a function
    taking the table) instead of the console, when ``log_only(cfg)`` is not None."""

    def display_config(cfg, *args, **kwargs):
        log = log_only(cfg)
        if log is None:
            return original(cfg, *args, **kwargs)
        table = io.StringIO()
        with contextlib.redirect_stdout(table):
            result = original(cfg, *args, **kwargs)
        log(table.getvalue())
        return result

    return display_config


def base_parser() -> Any:
    """The parser Data-Juicer's ``init_configs`` parses with (the plugin's options included)."""
    build = getattr(import_target(CONFIG_MODULE, where=f"{CONFIG_MODULE}.build_base_parser"), "build_base_parser", None)
    if not callable(build):  # the wrapped one, not target_function's original: the plugin's options count
        raise dj_moved(f"{CONFIG_MODULE}.build_base_parser is missing", where=f"{CONFIG_MODULE}.build_base_parser")
    return build()


def resolve_attempt(cfg: Any) -> Any:
    """Data-Juicer's own job id and directory resolution of a cfg, as ``init_setup_from_cfg`` does it."""
    resolve_job_id = target_function(CONFIG_MODULE, "resolve_job_id")
    return target_function(CONFIG_MODULE, "resolve_job_directories")(resolve_job_id(cfg))


def set_global_cfg(cfg: Any) -> None:
    """Leave ``cfg`` as Data-Juicer's current config, as ``init_configs`` does."""
    from data_juicer.config import config as dj_config

    if getattr(dj_config, "global_cfg", cfg) is not cfg:
        dj_config.global_cfg = cfg


def load_custom_operators(paths: list[str]) -> None:
    """Import ``custom_operator_paths`` into Data-Juicer's registry: each path at most once per
    process (one already loaded is skipped), in the given order.  The one loader: Data-Juicer's
    parse calls it too (:func:`wrap_load_custom_operators`).  A path that fails to load is
    RecipeError naming it (``file:line`` where its code raised) and leaves nothing behind, so a
    second try fails the same way."""
    loader = target_function(CONFIG_MODULE, "load_custom_operators")  # Data-Juicer's own, not the one installed over it
    for path in dict.fromkeys(os.path.abspath(each) for each in paths):
        if _loaded(path):
            continue
        name = _module_name(path)
        before = sys.modules.get(name)
        try:
            loader([path])
        except (RuntimeError, ValueError) as exc:  # what Data-Juicer's loader raises, wrapping the cause
            if sys.modules.get(name) is not before:  # a file's module half-executed
                sys.modules.pop(name, None)
            cause = exc.__context__ if isinstance(exc, RuntimeError) and exc.__context__ else exc
            raise RecipeError(
                f"cannot load this custom operator: {type(cause).__name__}: {cause}",
                where=_failed_at(path, cause),
                hint="fix the file, or the entry in custom_operator_paths; every node needs the custom operator "
                "files at the same absolute paths",
            ) from exc


def wrap_load_custom_operators(original: Any) -> Callable[..., Any]:
    """Data-Juicer's ``load_custom_operators`` replaced by :func:`load_custom_operators`."""
    return lambda paths: load_custom_operators(list(paths))


def _failed_at(path: str, cause: BaseException) -> str:
    """``file:line`` of the last place under ``path`` where ``cause`` was raised, else ``path``."""
    if isinstance(cause, SyntaxError) and cause.filename:
        return f"{cause.filename}:{cause.lineno}"
    tb = traceback.extract_tb(cause.__traceback__)
    frames = [f for f in tb if f.filename == path or f.filename.startswith(path + os.sep)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else path


def _module_name(abs_path: str) -> str:
    """The ``sys.modules`` name Data-Juicer's loader gives a file or folder."""
    name = os.path.basename(abs_path)
    return os.path.splitext(name)[0] if os.path.isfile(abs_path) else name


def _loaded(abs_path: str) -> bool:
    module = sys.modules.get(_module_name(abs_path))
    if module is None:
        return False
    loaded_from = getattr(module, "__loaded_from__", None) or getattr(module, "__file__", None) or ""
    return os.path.abspath(loaded_from) == abs_path or os.path.dirname(os.path.abspath(loaded_from)) == abs_path


def check_dj_config_module() -> str:
    module = import_target(CONFIG_MODULE, where=CONFIG_MODULE)
    missing = [name for name in (*WRAPPED, *CALLED, "setup_logger") if not callable(getattr(module, name, None))]
    if missing or not hasattr(module, "global_cfg"):
        raise dj_moved(f"{CONFIG_MODULE}: {', '.join(missing) or 'global_cfg'} missing", where=CONFIG_MODULE)
    return f"{CONFIG_MODULE}: {', '.join((*WRAPPED, *CALLED))}, setup_logger, global_cfg found"


# --- jsonargparse: a built parser's ``ArgumentParser._actions`` (``--executor_type`` is changed in
# place to accept ``elastic_sharded``), the ``<lambda>`` converter it makes for a ``type`` given with
# ``choices`` (closure cell ``typehint``; ``--help`` would print its repr as the type), and
# ``ArgumentParser.error(message, ex)``, replaced on one parser to add "did you mean" for an unknown
# ``elastic.*`` key.

PARSER_ACTIONS: Final = "jsonargparse.ArgumentParser._actions"


def actions(parser: Any) -> list[Any]:
    return list(getattr(parser, "_actions", ()))


def action_for(parser: Any, dest: str) -> Any:
    """The parser's action storing ``dest``, or None."""
    return next((a for a in actions(parser) if getattr(a, "dest", None) == dest), None)


def dests_starting(parser: Any, prefix: str) -> list[str]:
    return sorted(a.dest for a in actions(parser) if getattr(a, "dest", "").startswith(prefix))


def name_converter(action: Any) -> None:
    """Help text only: show the converter jsonargparse made for ``type`` with ``choices`` as that type."""
    convert = getattr(action, "type", None)
    code = getattr(convert, "__code__", None)
    if code is None or getattr(convert, "__name__", "") != "<lambda>" or "typehint" not in code.co_freevars:
        return
    typehint = convert.__closure__[code.co_freevars.index("typehint")].cell_contents
    action.type = NamedType(convert, getattr(typehint, "__name__", None) or str(typehint))


def amend_errors(parser: Any, amend: Callable[[str], str]) -> None:
    """Parse errors of this ``parser`` object show ``amend(message)``; jsonargparse still prints
    and exits (status 2) as it does.  Idempotent."""
    original = getattr(parser, "error", None)
    if not callable(original) or getattr(original, "_dj_elastic_amend", None) is amend:
        return

    def error(message: str, *args: Any, **kwargs: Any) -> Any:
        return original(amend(message) if isinstance(message, str) else message, *args, **kwargs)

    error._dj_elastic_amend = amend  # type: ignore[attr-defined]
    parser.error = error


class NamedType:
    """A converter that converts exactly as the one it wraps and shows as the type it converts to."""

    def __init__(self, convert, name: str):
        self.convert, self.name = convert, name

    def __call__(self, value):
        return self.convert(value)

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


def check_jsonargparse_actions() -> str:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--kind", type=str, choices=["a", "b"], default="a")
    action = action_for(parser, "kind")
    if action is None or list(action.choices) != ["a", "b"]:
        raise IntegrationError(
            f"{PARSER_ACTIONS}: a built parser's actions are no longer listed there", where=PARSER_ACTIONS
        )
    name_converter(action)
    if not isinstance(action.type, NamedType) or str(action.type) != "str":
        raise IntegrationError(
            f"{PARSER_ACTIONS}: the choices converter no longer closes over typehint", where=PARSER_ACTIONS
        )
    amend_errors(parser, lambda message: f"{message} [amended]")
    parser.exit_on_error = False  # raise the error instead of printing it and exiting
    amended = False
    try:
        parser.parse_args(["--kind", "c"])
    except Exception as exc:  # noqa: BLE001 - jsonargparse's ArgumentError
        amended = "[amended]" in str(exc)
    if not amended:
        raise IntegrationError(
            f"{PARSER_ACTIONS}: parse errors no longer pass ArgumentParser.error(message)", where=PARSER_ACTIONS
        )
    return f"{PARSER_ACTIONS}, the choices converter's typehint and ArgumentParser.error found"


# --- data_juicer.tools.process_data.main / analyze_data.main (wrapped), and each tool module's
# global ``init_configs``, swapped for the length of a call: ``main`` looks it up when it parses, and
# seeing the parsed cfg leave it is the only way to send ``elastic_sharded`` past ``main``'s
# hard-coded ``if/elif`` without copying ``main`` (``integration.dispatch``).

PROCESS_MODULE: Final = "data_juicer.tools.process_data"
ANALYZE_MODULE: Final = "data_juicer.tools.analyze_data"


def _problem(module: ModuleType) -> str | None:
    """Why ``module.main`` cannot be wrapped (None when it can)."""
    if not callable(getattr(module, "main", None)):
        return "function not found"
    if not callable(getattr(module, "init_configs", None)):
        return "its module no longer calls a module-level init_configs"
    return None


def wrap_main(module: ModuleType, call: Callable[[Any, tuple, dict], Any]) -> str:
    """Make ``module.main(*args, **kwargs)`` run ``call(original main, args, kwargs)``:
    :data:`APPLIED`, :data:`ALREADY`, or why the target is missing."""

    def make(original):
        def main(*args, **kwargs):
            return call(original, args, kwargs)

        return main

    return _problem(module) or wrap_function(module, "main", make)


@contextlib.contextmanager
def init_configs_replaced(module: ModuleType, make: Callable[[Any], Any]) -> Iterator[None]:
    """While entered, the tool module's ``init_configs`` is ``make(the real one)``."""
    real = module.init_configs
    replacement = make(real)
    module.init_configs = replacement
    try:
        yield
    finally:
        if module.init_configs is replacement:
            module.init_configs = real


def check_dj_tool_main() -> str:
    for name in (PROCESS_MODULE, ANALYZE_MODULE):
        missing = _problem(import_target(name, where=f"{name}.main"))
        if missing is not None:
            raise dj_moved(f"{name}.main: {missing}", where=f"{name}.main")
    return f"{PROCESS_MODULE}.main and {ANALYZE_MODULE}.main with a module-level init_configs found"


# --- The module globals ``load_ops`` (in ``data_juicer.ops`` and
# ``data_juicer.core.executor.ray_executor``, which ``RayExecutor.run`` calls) and
# ``data_juicer.utils.process_utils.calculate_ray_np`` (imported by ``RayDataset.process`` on every
# call), swapped per shard run: warm operators keep a recipe's operators and their resource plan
# across shards (docs/warm-operators.md); Data-Juicer builds and sizes them anew and has no hook.

LOAD_OPS_MODULES: Final = ("data_juicer.ops", "data_juicer.core.executor.ray_executor")
PLANNER_MODULE: Final = "data_juicer.utils.process_utils"


def target_module(name: str, attribute: str) -> Any:
    """Module ``name`` with a callable global ``attribute``, or IntegrationError."""
    module = import_target(name)
    if not callable(module.__dict__.get(attribute)):
        raise dj_moved(f"{name}.{attribute} is missing", also=", or set DJ_ELASTIC_WARM_OPERATORS=0")
    return module


@contextlib.contextmanager
def load_ops_replaced(load: Callable[..., Any], plan: Callable[..., Any]) -> Iterator[None]:
    """While entered, ``load_ops(process_list, op_env_manager=None)`` is ``load(original, process_list,
    op_env_manager)`` and ``calculate_ray_np(operators, ...)`` is ``plan(original, operators, ...)``."""
    targets = [(target_module(name, "load_ops"), "load_ops") for name in LOAD_OPS_MODULES]
    targets.append((target_module(PLANNER_MODULE, "calculate_ray_np"), "calculate_ray_np"))
    saved = [(module, name, module.__dict__[name]) for module, name in targets]
    original_load, original_plan = saved[0][2], saved[-1][2]

    def load_ops(process_list, op_env_manager=None):
        return load(original_load, process_list, op_env_manager)

    def calculate_ray_np(operators, *args, **kwargs):
        return plan(original_plan, operators, *args, **kwargs)

    load_ops.__wrapped__ = original_load
    calculate_ray_np.__wrapped__ = original_plan
    for module, name, _ in saved:
        setattr(module, name, calculate_ray_np if name == "calculate_ray_np" else load_ops)
    try:
        yield
    finally:
        for module, name, found in saved:
            setattr(module, name, found)


def check_dj_load_ops() -> str:
    for name in LOAD_OPS_MODULES:
        parameters = tuple(inspect.signature(target_module(name, "load_ops").load_ops).parameters)
        if parameters[:2] != ("process_list", "op_env_manager"):
            raise dj_moved(f"{name}.load_ops no longer takes (process_list, op_env_manager): {parameters}")
    target_module(PLANNER_MODULE, "calculate_ray_np")
    return f"load_ops in {', '.join(LOAD_OPS_MODULES)} and {PLANNER_MODULE}.calculate_ray_np found"
