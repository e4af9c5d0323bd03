"""py-data-juicer 1.6.1: ``data_juicer.config.config``, where a parsed config can be accepted, checked
and kept before its setup mutates it (Data-Juicer has no executor plugin interface;
``integration.patches`` decides what each hook does).

Wrapped: ``build_base_parser``, ``init_setup_from_cfg`` (an elastic cfg runs without ``RAY_JOB``,
whose CPU-count probe would start Ray in the driver, and with ``setup_logger`` replaced),
``display_config`` (it prints on stdout) and ``load_custom_operators`` (through the plugin's loader:
each path once per process, a broken one is one error, docs/failure-semantics.md row 34).  Called:
``resolve_job_id`` / ``resolve_job_directories`` and ``global_cfg`` to re-base a shard config, and
the loader itself, with the ``sys.modules`` entries it makes (named after each file or folder).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, import_target, target_function
from data_juicer_elastic.errors import RecipeError

MODULE: Final = "data_juicer.config.config"
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
    build = getattr(import_target(MODULE, where=f"{MODULE}.build_base_parser"), "build_base_parser", None)
    if not callable(build):  # the wrapped one, not target_function's original: the plugin's options count
        raise dj_moved(f"{MODULE}.build_base_parser is missing", where=f"{MODULE}.build_base_parser")
    return build()


def resolve_attempt(cfg: Any) -> Any:
    """Data-Juicer's own job id and directory resolution of a cfg, as ``init_setup_from_cfg`` does it."""
    resolve_job_id = target_function(MODULE, "resolve_job_id")
    return target_function(MODULE, "resolve_job_directories")(resolve_job_id(cfg))


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
    loader = target_function(MODULE, "load_custom_operators")  # Data-Juicer's own, not the one installed over it
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


def self_check() -> str:
    module = import_target(MODULE, where=MODULE)
    missing = [name for name in (*WRAPPED, *CALLED, "setup_logger") if not callable(getattr(module, name, None))]
    if missing or not hasattr(module, "global_cfg"):
        raise dj_moved(f"{MODULE}: {', '.join(missing) or 'global_cfg'} missing", where=MODULE)
    return f"{MODULE}: {', '.join((*WRAPPED, *CALLED))}, setup_logger, global_cfg found"
