"""ElasticShardedExecutor: what ``dj-process`` runs for ``executor_type: elastic_sharded``.

It composes three independent pieces and owns none of their logic:

1. prepare (``jobdir.prepare``): split the input into shards once, idempotently;
2. work (``jobdir.worker_loop`` + ``execution``): claim shards one by one and run
   each through Data-Juicer's own RayExecutor on one warm node-local Ray runtime;
3. finalize (``jobdir.merge``): validate every shard result and merge in order.

The same command on many nodes sharing ``job_dir`` cooperates through the job
directory only; every instance finishes by merging (the merge is idempotent:
an identical existing output counts as success).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loguru import logger

from data_juicer_elastic import __version__
from data_juicer_elastic.errors import ConfigError, ShardFailedError
from data_juicer_elastic.jobdir.identity import WorkerIdentity
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.merge import MergeResult, merge_job
from data_juicer_elastic.jobdir.prepare import PrepareOutcome, PrepareRequest, prepare_job
from data_juicer_elastic.jobdir.status import snapshot
from data_juicer_elastic.jobdir.worker_loop import WorkerSummary, run_worker
from data_juicer_elastic.settings import ElasticSettings

try:  # Data-Juicer's base class, so ExecutorFactory users get a real executor
    from data_juicer.core.executor.base import ExecutorBase
except ImportError as exc:  # pragma: no cover - only when Data-Juicer moved it
    from data_juicer_elastic.errors import IntegrationError

    raise IntegrationError(
        "data_juicer.core.executor.base.ExecutorBase is missing",
        where="py-data-juicer",
        hint="install py-data-juicer>=1.6.1,<1.7",
    ) from exc


def _resolve(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


def prepare_from_cfg(cfg: Any, settings: ElasticSettings) -> PrepareOutcome:
    """Validate the recipe and input, and publish the job directory (a no-op when identical)."""
    from data_juicer_elastic.execution.stage_identities import compute_stage_identities
    from data_juicer_elastic.integration.recipe import build_shard_recipe, index_key, media_keys
    from data_juicer_elastic.integration.recipe_check import check_shard_safe

    if not getattr(cfg, "dataset_path", None):
        raise ConfigError("dataset_path is not set", where="recipe", hint="set dataset_path to a .jsonl file or folder")
    recipe = build_shard_recipe(cfg)
    check_shard_safe(recipe)
    import data_juicer

    request = PrepareRequest(
        job_dir=_resolve(settings.job_dir),
        dataset_path=_resolve(cfg.dataset_path),
        num_shards=settings.num_shards,
        recipe=recipe,
        stage_identities=compute_stage_identities(recipe),
        media_keys=media_keys(cfg),
        index_key=index_key(cfg),
        settings=settings.to_dict(),
        versions={"data_juicer": data_juicer.__version__, "data_juicer_elastic": __version__},
        ray={"address": settings.ray_address, "num_cpus": settings.ray_num_cpus},
    )
    outcome = prepare_job(request)
    verb = "prepared" if outcome.created else "reusing prepared"
    logger.info(f"{verb} job {request.job_dir} ({len(outcome.manifest.shards)} shards)")
    return outcome


def run_local_worker(
    job_dir: str | os.PathLike,
    settings: ElasticSettings,
    *,
    wait_for_completion: bool = True,
    node_id: str | None = None,
) -> WorkerSummary:
    """Claim and process shards with one warm Ray runtime until nothing is left.

    Ray starts on the first claim only, so re-running a finished job (or a
    worker that finds nothing to do) costs no Ray start.
    """
    job = _resolve(job_dir)
    manifest = load_manifest(job)
    _default_caches(JobLayout(job).cache_dir)
    identity = WorkerIdentity.current(node_id=node_id)
    from data_juicer_elastic.execution.lazy_runner import LazyShardRunner

    runner = LazyShardRunner(
        manifest.recipe,
        list(manifest.stage_identities),
        JobLayout(job).cache_dir,
        ray_address=settings.ray_address,
        ray_num_cpus=settings.ray_num_cpus,
    )
    logger.info(f"worker {identity.node_id} (pid {identity.pid}) joining job {job}")
    with runner:
        summary = run_worker(
            job,
            identity,
            runner,
            ttl_secs=settings.lease_ttl_secs,
            heartbeat_secs=settings.heartbeat_secs,
            max_retries=settings.max_retries,
            poll_interval_secs=settings.poll_interval_secs,
            max_shards=settings.max_shards,
            wait_for_completion=wait_for_completion,
        )
    logger.info(f"worker {identity.node_id} finished: {summary}")
    return summary


def finalize(job_dir: str | os.PathLike, export_path: str | os.PathLike, *, overwrite: bool = False) -> MergeResult:
    """Fail clearly on terminal shard failures, else merge every shard in manifest order."""
    job = _resolve(job_dir)
    snap = snapshot(job)
    if snap.terminal_failures:
        shard_id, last_error = snap.terminal_failures[0]
        raise ShardFailedError(
            f"{len(snap.terminal_failures)} shard(s) failed terminally; first: {shard_id}: {last_error}",
            where=str(job),
            hint="inspect the attempt logs shown by `dj-elastic status --job-dir ...`, fix the cause, then "
            "`dj-elastic retry --all-failed` and run again",
        )
    result = merge_job(job, _resolve(export_path), overwrite=overwrite)
    logger.info(f"merged {result.rows} rows from {result.shards} shards into {result.output_path}")
    return result


def _default_caches(cache_dir: Path) -> None:
    # Model caches default into the shared job dir so every node reuses one
    # download instead of filling node-local disks; explicit user settings win.
    for var, sub in (("HF_HOME", "huggingface"), ("XDG_CACHE_HOME", "xdg")):
        os.environ.setdefault(var, str(cache_dir / sub))


class ElasticShardedExecutor(ExecutorBase):
    """Run a Data-Juicer recipe through shared-storage shards and node-local Ray."""

    def __init__(self, cfg: Any = None):
        if cfg is None:
            from data_juicer.config import init_configs

            cfg = init_configs()
        self.cfg = cfg
        self.executor_type = "elastic_sharded"
        from data_juicer_elastic.integration.config_block import settings_from_cfg

        self.settings = settings_from_cfg(cfg)

    def run(self, load_data_np: Any = None, skip_return: bool = False) -> MergeResult | None:
        if not getattr(self.cfg, "export_path", None):
            raise ConfigError("export_path is not set", where="recipe", hint="set export_path to the merged .jsonl")
        prepare_from_cfg(self.cfg, self.settings)
        summary = run_local_worker(self.settings.job_dir, self.settings)
        if summary.stop_reason == "max_shards" and not summary.complete and not summary.terminal_failures:
            # This instance reached its claim cap; instances still working (or
            # `dj-elastic merge`) finalize the job.  Same meaning as a worker's exit 0.
            logger.info(f"reached elastic.max_shards={self.settings.max_shards}; leaving the merge to the others")
            return None
        if summary.lost:
            logger.warning(f"this worker lost {summary.lost} claim(s) to other workers; their shards were redone")
        return finalize(self.settings.job_dir, self.cfg.export_path, overwrite=self.settings.overwrite_output)
