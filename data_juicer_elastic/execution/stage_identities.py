"""A shard recipe as Data-Juicer parses it, and its stage identities exactly as RayExecutor computes them.

The recipe becomes Data-Juicer's own config object through ``init_configs``, as ``dj-process --config``
would parse it (``load_configs_only``: no process-wide loguru setup, config backup or table);
:class:`ShardConfigs` parses once per worker process (0.2-1.2 s on a 2-CPU node) and re-bases that
namespace per attempt.  The identities: the ops loaded, fused and identified as ``RayExecutor.run``
does, from a config parsed for ``executor_type: ray`` (its Ray-mode attribute injection is what makes
them a Ray run's).  No Ray starts.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from loguru import logger

from data_juicer_elastic.compat import dj_config_internals, dj_ops_internals
from data_juicer_elastic.compat.dj_config_internals import RAY_JOB_ENV
from data_juicer_elastic.compat.dj_ops_internals import no_ray_start
from data_juicer_elastic.errors import RecipeError, StageIdentityMismatch, last_line

_DERIVED_DIRS: Final = ("event_log_dir", "checkpoint_dir", "partition_dir")


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
    """Write ``recipe | overrides`` to ``config_path``, parse it with ``init_configs`` (inside
    :func:`ray_job_env`) and return Data-Juicer's ``Namespace``."""
    from data_juicer.config import init_configs

    data = write_recipe_file(recipe, overrides, config_path)
    custom_paths = data.get("custom_operator_paths") or None
    where = where or str(config_path)
    if custom_paths:
        # Register custom operators BEFORE the parse.  Data-Juicer's parser gives an operator its
        # full set of default arguments only when it is registered while the parser is built; a
        # first parse in a fresh process would otherwise give it fewer init kwargs than every later
        # one, and its stage identity (a hash of those kwargs) would depend on how many recipes this
        # process had parsed.  Data-Juicer also refuses a second import of the same module, so
        # parse without the paths and put the value back afterwards.
        dj_config_internals.load_custom_operators(custom_paths)
    captured = io.StringIO()
    hint = "the recipe must be a valid Data-Juicer config for executor_type ray"
    try:
        with contextlib.redirect_stderr(captured):
            cfg = init_configs(args=["--config", str(config_path)], load_configs_only=True)
    except SystemExit:  # jsonargparse reports a rejected option on stderr and exits
        reason = last_line(captured.getvalue()) or "parser exited"
        raise RecipeError(f"Data-Juicer rejected the shard recipe: {reason}", where=where, hint=hint) from None
    except (ValueError, TypeError, KeyError, RuntimeError, NotImplementedError, ImportError) as exc:
        raise RecipeError(f"Data-Juicer could not set up the shard recipe: {exc}", where=where, hint=hint) from exc
    finally:
        if captured.getvalue():
            sys.stderr.write(captured.getvalue())
    if custom_paths and not cfg.get("custom_operator_paths"):
        cfg.custom_operator_paths = custom_paths
    return cfg


class ShardConfigs:
    """Data-Juicer configs for one shard recipe: parsed once, re-based for every later attempt (a deep
    copy whose per-attempt fields Data-Juicer's own ``resolve_attempt`` resolves again; operators get the
    new ``work_dir``).  Guard: if any string of a re-based config still holds a path of the template's
    attempt (a field a newer Data-Juicer derives), this and every later attempt is parsed afresh.
    """

    def __init__(self, recipe: Mapping[str, Any]):
        self.recipe = check_recipe(recipe)
        self._template: Any = None
        self._template_overrides: dict[str, Any] = {}
        self._template_config_path = ""
        self._rebase_ok = True
        self.parses = 0  # how many times Data-Juicer's parser ran (for tests and logs)

    def load(self, overrides: Mapping[str, Any], config_path: Path) -> Any:
        if self._template is not None and self._rebase_ok and set(overrides) == set(self._template_overrides):
            write_recipe_file(self.recipe, overrides, config_path)
            cfg = self._rebase(dict(overrides), config_path)
            stale = self._stale_field(cfg, overrides, config_path)
            if stale is None:
                return cfg
            self._rebase_ok = False
            logger.warning(
                f"Data-Juicer config field {stale!r} kept the first attempt's value when re-based; "
                "parsing the recipe for every attempt from now on (slower, same result)"
            )
        self.parses += 1
        cfg = load_dj_config(self.recipe, overrides, config_path)
        if self._template is None:
            self._template = copy.deepcopy(cfg)
            self._template_overrides = dict(overrides)
            self._template_config_path = str(config_path)
        return cfg

    def _rebase(self, overrides: dict[str, Any], config_path: Path) -> Any:
        template = self._template
        cfg = copy.deepcopy(template)
        old_work_dir = template.work_dir
        config_entry = template.config[0]
        cfg.config = [type(config_entry)(str(config_path), mode=config_entry.mode)]
        for key, value in overrides.items():
            setattr(cfg, key, value)
        cfg.executor_type = "ray"
        for key in _DERIVED_DIRS:  # the shard recipe never sets them: they follow work_dir
            setattr(cfg, key, None)
        # init_setup_from_cfg for a local export path, then Data-Juicer's own resolution
        cfg.export_path = os.path.abspath(cfg.export_path)
        cfg = dj_config_internals.resolve_attempt(cfg)
        if cfg.get("dataset_path", None) and os.path.exists(cfg.dataset_path):
            cfg.dataset_path = os.path.abspath(cfg.dataset_path)
        for op in cfg.process or []:
            for args in op.values():
                if args is not None and args.get("work_dir") == old_work_dir:
                    args["work_dir"] = cfg.work_dir
        dj_config_internals.set_global_cfg(cfg)  # as init_configs leaves it
        return cfg

    def _stale_field(self, cfg: Any, overrides: Mapping[str, Any], config_path: Path) -> str | None:
        """The first field that still holds a path or job id only the template attempt had."""
        old = self._template_overrides
        old_paths = {self._template_config_path, self._template.work_dir}
        old_paths.update(str(old[k]) for k in ("work_dir", "export_path") if k in old)
        old_paths.discard(str(config_path))
        old_paths.difference_update({cfg.work_dir, str(overrides.get("work_dir")), str(overrides.get("export_path"))})
        old_job_id = old.get("job_id")
        if old_job_id == overrides.get("job_id"):
            old_job_id = None
        for name, value in _strings(vars(cfg)):
            if value == old_job_id or any(path and path in value for path in old_paths):
                return name
        return None


def write_recipe_file(recipe: Mapping[str, Any], overrides: Mapping[str, Any], config_path: Path) -> dict[str, Any]:
    """Write the recipe Data-Juicer parses for an attempt; returns it (custom paths still in)."""
    data = {k: v for k, v in check_recipe(recipe).items() if k not in overrides}
    data.update(overrides)
    data["executor_type"] = "ray"
    # Parsed without the custom paths (load_dj_config registers them first, see there).
    written = {k: v for k, v in data.items() if k != "custom_operator_paths" or not v}
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(written, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return data


def _strings(value: Any, name: str = "cfg") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield name, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(item, f"{name}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _strings(item, f"{name}[{index}]")
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        yield from _strings(vars(value), name)
    elif isinstance(value, os.PathLike):
        yield name, os.fspath(value)


@contextlib.contextmanager
def ray_job_env() -> Iterator[None]:
    """``RAY_JOB=1`` (as init_configs sets it for executor_type ray; Data-Juicer's is_ray_mode reads
    it while loading ops) while Data-Juicer parses and loads ops, then the previous value."""
    previous = os.environ.get(RAY_JOB_ENV)
    os.environ[RAY_JOB_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(RAY_JOB_ENV, None)
        else:
            os.environ[RAY_JOB_ENV] = previous


def compute_stage_identities(recipe: Mapping[str, Any]) -> list[str]:
    """The ordered stage ids (``stage-0000-occ0-1a2b3c4d:op_name``) of ``recipe``'s ops."""
    with tempfile.TemporaryDirectory(prefix="dj-elastic-identity-") as tmp:
        root = Path(tmp)
        (root / "input.jsonl").touch()  # a real path keeps Data-Juicer from warning about it
        overrides = {
            "dataset_path": str(root / "input.jsonl"),
            "export_path": str(root / "output.jsonl"),
            "export_type": "jsonl",
            "work_dir": str(root / "work"),
            "job_id": "stage-identities",
        }
        with ray_job_env(), no_ray_start():
            cfg = load_dj_config(recipe, overrides, root / "recipe.yaml", where="shard recipe")
            return stage_ids(manifest_from_cfg(cfg))


def manifest_from_cfg(cfg: Any) -> dict[str, Any]:
    """Data-Juicer's identity manifest (``stages`` ...), by the steps of ``RayExecutor.run`` that fix it."""
    # Looked up at each call: while a shard runs, warm_ops has swapped data_juicer.ops.load_ops.
    from data_juicer.ops import load_ops

    dj_ops_internals.check_identity_functions()  # a Data-Juicer without them: refused before any op is built
    # OPEnvManager (min_common_dep_num_to_combine) only sets runtime envs, which
    # are not part of an operator's fingerprint, so it is not built here.
    ops = load_ops(cfg.process)
    if cfg.get("op_fusion", False):
        ops = dj_ops_internals.fused(
            ops,
            mapper_fusion=cfg.get("mapper_fusion", True),
            mapper_fusion_vram_limit=cfg.get("mapper_fusion_vram_limit", 0.9),
        )
    return dj_ops_internals.identity_manifest(ops)


def stage_ids(manifest: Mapping[str, Any]) -> list[str]:
    return [stage["stage_id"] for stage in manifest["stages"]]


def verify_stage_identities(expected: Sequence[str], actual: Sequence[str], *, where: str) -> None:
    """Raise StageIdentityMismatch naming the first stage that differs."""
    expected, actual = list(expected), list(actual)
    if expected == actual:
        return
    for index in range(max(len(expected), len(actual))):
        want = expected[index] if index < len(expected) else "<no stage>"
        have = actual[index] if index < len(actual) else "<no stage>"
        if want != have:
            break
    raise StageIdentityMismatch(
        f"stage {index} differs: the job expects {want!r}, this worker computes {have!r} "
        f"({len(expected)} stages expected, {len(actual)} here); this worker's Data-Juicer or operator code "
        "differs from the one that prepared the job",
        where=where,
        hint="install the same py-data-juicer and operator code on every worker node "
        "(see the job manifest's versions), or prepare a new job",
    )


def write_identity_record(path: Path, manifest: Mapping[str, Any], expected: Sequence[str]) -> None:
    """Stamp the identities an attempt computed into ``attempt_dir/stage_identities.json``."""
    import data_juicer

    record = {
        "format": "dj-elastic/stage-identities",
        "version": 1,
        "data_juicer": getattr(data_juicer, "__version__", "unknown"),
        "stage_ids": stage_ids(manifest),
        "expected_stage_ids": list(expected),
        "manifest": dict(manifest),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
