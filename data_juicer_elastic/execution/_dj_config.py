"""A shard recipe -> Data-Juicer's own config object, through Data-Juicer's parser.

The recipe is written to a YAML file and parsed by ``init_configs`` exactly as
``dj-process --config`` would, so defaults, op-argument merging and the
per-executor attribute injection (``num_proc`` only outside Ray) are Data-Juicer's.
``load_configs_only=True`` keeps ``init_configs`` away from the process-wide
loguru setup (the caller routes logs per attempt), the config backup and the
config table.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from data_juicer_elastic.errors import IntegrationError, RecipeError

# data_juicer.utils.constant.RAY_JOB_ENV_VAR: init_configs sets it to "1" for
# executor_type ray, and Data-Juicer reads it (is_ray_mode) while loading ops.
RAY_JOB_ENV: Final = "RAY_JOB"

# Set per attempt by the runner; a recipe value for these would be overridden.
PER_ATTEMPT_KEYS: Final = frozenset(
    {
        "dataset_path",
        "dataset",
        "export_path",
        "export_type",
        "work_dir",
        "job_id",
        "event_log_dir",
        "checkpoint_dir",
        "partition_dir",
        "ray_address",
    }
)

_NO_RAY_LOCK = threading.Lock()


def check_recipe(recipe: Any) -> dict[str, Any]:
    """The shard-recipe invariants this package relies on."""
    if not isinstance(recipe, Mapping):
        raise RecipeError(f"the shard recipe must be a mapping, not {type(recipe).__name__}", where="recipe")
    if "elastic" in recipe:
        raise RecipeError(
            "the shard recipe still has an 'elastic' block",
            where="recipe",
            hint="pass the recipe built by integration.recipe.build_shard_recipe",
        )
    executor_type = recipe.get("executor_type", "ray")
    if executor_type != "ray":
        raise RecipeError(
            f"the shard recipe has executor_type {executor_type!r}; shards run with 'ray'",
            where="recipe.executor_type",
            hint="build the shard recipe with integration.recipe.build_shard_recipe",
        )
    return dict(recipe)


def load_dj_config(
    recipe: Mapping[str, Any], overrides: Mapping[str, Any], config_path: Path, *, where: str | None = None
) -> Any:
    """Write ``recipe | overrides`` to ``config_path`` and parse it with ``init_configs``.

    Call inside :func:`ray_job_env`.  Returns Data-Juicer's ``Namespace``.
    """
    from data_juicer.config import init_configs

    data = {k: v for k, v in check_recipe(recipe).items() if k not in overrides}
    data.update(overrides)
    data["executor_type"] = "ray"
    custom_paths = data.get("custom_operator_paths") or None
    if custom_paths:
        # Register custom operators BEFORE the parse.  Data-Juicer's parser gives
        # an operator its full set of default arguments only when the operator is
        # registered while the parser is built; a first parse in a fresh process
        # would otherwise give it fewer init kwargs than every later parse, and
        # its stage identity (a hash of those kwargs) would depend on how many
        # recipes this process had parsed before.  Data-Juicer also refuses a
        # second import of the same module, so parse without the paths and put
        # the value back afterwards.
        if not _already_loaded(custom_paths):
            _load_custom_operators(custom_paths, where=where or str(config_path))
        data.pop("custom_operator_paths")
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            cfg = init_configs(args=["--config", str(config_path)], load_configs_only=True)
    except SystemExit:
        # jsonargparse reports a rejected option on stderr and exits.
        raise RecipeError(
            f"Data-Juicer rejected the shard recipe: {_last_line(captured.getvalue()) or 'parser exited'}",
            where=where or str(config_path),
            hint="the recipe must be a valid Data-Juicer config for executor_type ray",
        ) from None
    except (ValueError, TypeError, KeyError, RuntimeError, NotImplementedError, ImportError) as exc:
        raise RecipeError(
            f"Data-Juicer could not set up the shard recipe: {exc}",
            where=where or str(config_path),
            hint="the recipe must be a valid Data-Juicer config for executor_type ray",
        ) from exc
    finally:
        if captured.getvalue():
            sys.stderr.write(captured.getvalue())
    if custom_paths and not cfg.get("custom_operator_paths"):
        cfg.custom_operator_paths = custom_paths
    return cfg


@contextlib.contextmanager
def ray_job_env() -> Iterator[None]:
    """``RAY_JOB=1`` while Data-Juicer parses and loads ops, then the previous value."""
    previous = os.environ.get(RAY_JOB_ENV)
    os.environ[RAY_JOB_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(RAY_JOB_ENV, None)
        else:
            os.environ[RAY_JOB_ENV] = previous


@contextlib.contextmanager
def no_ray_start() -> Iterator[None]:
    """Keep Data-Juicer's resource probes (``cpu_count`` in init_configs) off Ray.

    With ``RAY_JOB=1`` they call ``ray.init(cfg.ray_address)``, which starts
    nothing but attaches to any runtime found on the node.  Only the CPU count
    changes (it clamps ``np``), which never reaches a Ray operator's arguments.
    """
    try:
        from data_juicer.utils import resource_utils
    except ImportError as exc:  # pragma: no cover - Data-Juicer moved it
        raise IntegrationError("data_juicer.utils.resource_utils is missing", where="py-data-juicer") from exc
    original = getattr(resource_utils, "check_and_initialize_ray", None)
    if original is None:
        raise IntegrationError(
            "data_juicer.utils.resource_utils.check_and_initialize_ray is missing",
            where="py-data-juicer",
            hint="install py-data-juicer>=1.6.1,<1.7",
        )
    with _NO_RAY_LOCK:
        resource_utils.check_and_initialize_ray = _never
        try:
            yield
        finally:
            resource_utils.check_and_initialize_ray = original


def _never(cfg: Any = None) -> bool:
    return False


def _load_custom_operators(paths: list[str], where: str) -> None:
    from data_juicer.config.config import load_custom_operators

    try:
        load_custom_operators(paths)
    except (RuntimeError, ValueError, ImportError) as exc:
        raise RecipeError(
            f"could not load custom_operator_paths: {exc}",
            where=where,
            hint="every worker node needs the custom operator files at the same absolute paths",
        ) from exc


def _already_loaded(paths: list[str]) -> bool:
    for path in paths:
        abs_path = os.path.abspath(path)
        name = os.path.basename(abs_path)
        if os.path.isfile(abs_path):
            name = os.path.splitext(name)[0]
        module = sys.modules.get(name)
        if module is None:
            return False
        loaded_from = getattr(module, "__loaded_from__", None) or getattr(module, "__file__", None) or ""
        if os.path.abspath(loaded_from) != abs_path and os.path.dirname(os.path.abspath(loaded_from)) != abs_path:
            return False
    return True


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
