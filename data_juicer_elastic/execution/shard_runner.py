"""Run one claimed shard through Data-Juicer's own RayExecutor on the warm runtime: read by
``shard_reader``, written by ``row_writer``, operators kept warm (``warm_ops``), failing rows set
aside (``quarantine``).  The attempt directory's files: docs/architecture.md, "Job directory".

The attempt's driver-side logs (loguru, Ray Data's ``ray.data``) go into ``attempt_dir/process.log``,
a sink per attempt.  Output printed inside Ray worker processes is not captured (Ray forwards it, in
batches that can arrive after the attempt ended, and keeps it in ``logs/worker-*.err``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import shlex
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.batching.runtime import BatchingContext, StageRef, summarize_attempt, write_context
from data_juicer_elastic.compat import dj_ops_internals, ray_internals
from data_juicer_elastic.console.log_files import LogFile
from data_juicer_elastic.dedup.stages import DedupStage, dedup_stages
from data_juicer_elastic.errors import ElasticError, IntegrationError, ShardExecutionError, clip
from data_juicer_elastic.execution.dedup_runner import (
    FINAL,
    collect_signatures,
    marked_stages,
    phase_recipe,
    phase_stage_ids,
    signature_phase,
    with_drop_columns,
)
from data_juicer_elastic.execution.progress_source import note_stage, ray_data_progress
from data_juicer_elastic.execution.row_writer import ExportLayout, write_shard
from data_juicer_elastic.execution.shard_reader import ArrowRows, InputRows, read_tables, shard_key, shard_source
from data_juicer_elastic.execution.stage_identities import (
    RAY_JOB_ENV,
    ShardConfigs,
    manifest_from_cfg,
    ray_job_env,
    stage_ids,
    verify_stage_identities,
    write_identity_record,
)
from data_juicer_elastic.execution.warm_ops import WarmOperators
from data_juicer_elastic.jobdir import heartbeats
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask, SignatureOutput, SignatureTask
from data_juicer_elastic.jobdir.exports import ROW_STATS_FILE
from data_juicer_elastic.jobdir.layout import LOG_FILE, JobLayout
from data_juicer_elastic.quarantine.collector import check_limit, fold_errors
from data_juicer_elastic.rows.shard_source import ShardSource, iter_source_lines
from data_juicer_elastic.settings import DEFAULT_MAX_ERROR_ROWS
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.stats.shard_summary import ShardStatsRecorder

_FORMAT: Final = "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{line} - {message}"


@contextlib.contextmanager
def attempt_log(path: Path, level: str = "INFO") -> Iterator[None]:
    # One line-buffered stream shared by both writers keeps their lines whole and in order;
    # append mode keeps what an earlier step of this attempt wrote.  A full disk costs its
    # lines, never the attempt (``console.log_files``): the output write reports it.
    stream = LogFile(path, "the attempt log")
    sink_id = logger.add(
        stream,
        level=level,
        format=_FORMAT,
        colorize=False,
        enqueue=False,  # synchronous: every line is on disk before the sink is removed
        backtrace=False,
        diagnose=False,  # no variable values (possibly row contents) in tracebacks
    )
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-8s | %(name)s - %(message)s"))
    ray_data = logging.getLogger("ray.data")
    ray_data.addHandler(handler)
    try:
        yield
    finally:
        ray_data.removeHandler(handler)
        with contextlib.suppress(ValueError):  # someone called logger.remove() for all sinks
            logger.remove(sink_id)
        stream.stop()


# Environment Data-Juicer's initialize_ray forwards to Ray workers
# (data_juicer.utils.mm_utils.SPECIAL_TOKEN_ENV_PREFIX).
_SPECIAL_TOKEN_PREFIX: Final = "SPECIAL_TOKEN_"
_CACHE_VARS: Final = (("HF_HOME", "huggingface"), ("XDG_CACHE_HOME", "xdg"))


def default_cache_env(cache_dir: Path) -> dict[str, str]:
    """Point HF_HOME / XDG_CACHE_HOME into ``cache_dir`` unless set; returns the values in effect."""
    for var, sub in _CACHE_VARS:
        os.environ.setdefault(var, str(Path(cache_dir) / sub))
    return {var: os.environ[var] for var, _ in _CACHE_VARS}


def shard_runtime_env(recipe: Mapping[str, Any], cache_dir: Path) -> dict[str, Any]:
    """The Ray runtime_env a ``dj-process`` run of ``recipe`` gives its workers (``RAY_JOB``, the
    special-token variables, custom operator paths as ``py_modules``), plus the job's shared model
    caches and this package's fixes of Ray's block concatenation (compat.ray_internals)."""
    env_vars = {RAY_JOB_ENV: "1", **default_cache_env(cache_dir)}
    env_vars.update({k: v for k, v in os.environ.items() if k.startswith(_SPECIAL_TOKEN_PREFIX)})
    runtime_env: dict[str, Any] = {"env_vars": env_vars, "worker_process_setup_hook": ray_internals.SETUP_HOOK}
    custom_paths = recipe.get("custom_operator_paths") or None
    if custom_paths:
        runtime_env["py_modules"] = [os.path.abspath(p) for p in custom_paths]
    return runtime_env


class ShardRunner:
    """``run_shard`` for the worker loop: ``runner(task) -> ShardOutput``, on the Ray runtime this
    process is connected to.  ``row_schema``: the job's (the manifest's), or how to read it.

    A recipe with deduplicators (docs/dedup.md): ``runner.signatures(task) -> SignatureOutput`` runs a
    shard's signature phase of one stage, and ``runner(task)`` the final recipe with every stage's drop
    list (``ShardTask.drops``); both on the same runtime, warm operators and attempt log.
    ``expected_stage_identities`` are the job recipe's (with its deduplicators): each phase recipe's are
    checked against them (``dedup_runner.phase_stage_ids``).  ``stages``: the recipe's dedup stages as the
    recipe check made them (default: ``dedup.stages.dedup_stages`` of the process list as written)."""

    def __init__(
        self,
        recipe: dict[str, Any],
        expected_stage_identities: Sequence[str],
        cache_dir: Path,
        *,
        row_schema: list[Any] | None | Callable[[], list[Any] | None],
        max_error_rows: float = DEFAULT_MAX_ERROR_ROWS,
        stages: list[DedupStage] | None = None,
    ):
        self.max_error_rows = max_error_rows  # quarantined rows a shard may have (elastic.max_error_rows)
        self.expected_stage_identities = list(expected_stage_identities)
        self._row_schema = row_schema  # a callable: the job is not scanned yet when a worker starts
        self._rows: ArrowRows | None = None
        ray_internals.install_concat_fixes()  # the driver concatenates blocks too (its Ray workers get the setup hook)
        self.recipe = copy.deepcopy(recipe)
        # its deduplicators (none: the final phase is the recipe): as the recipe check made them
        # (``stages``: a Ray version's own keys dropped), else as the recipe writes them
        self.stages = list(stages) if stages is not None else dedup_stages(list(self.recipe.get("process") or []))
        # per phase recipe (dedup_runner): identities are per recipe and process, not per shard;
        # configs parsed once per process, re-based per attempt
        self._manifests: dict[str, dict[str, Any]] = {}
        self._phase_configs: dict[str, ShardConfigs] = {}
        self.warm = WarmOperators()  # operators and actor-mode actors kept across shards (warm_ops)
        self.reads_ahead_used = 0  # runs that used a read-ahead (tests, logs)
        default_cache_env(Path(cache_dir))

    @property
    def rows(self) -> ArrowRows:
        if self._rows is None:
            schema = self._row_schema() if callable(self._row_schema) else self._row_schema
            self._rows = ArrowRows.from_manifest(schema, where="manifest.json row_schema")
        return self._rows

    def read_ahead(self, source: ShardSource) -> list[Any]:
        """The shard parsed into its Arrow tables now (plain CPU work, no Ray call): the claim-ahead
        thread calls it while the current shard runs and hands it to the run (``ShardTask.read_ahead``)."""
        return read_tables(source, self.rows)

    def _configs(self, phase: str) -> ShardConfigs:
        found = self._phase_configs.get(phase)
        if found is None:
            found = self._phase_configs[phase] = ShardConfigs(phase_recipe(self.recipe, self.stages, phase))
        return found

    def _tables(self, task: ShardTask | SignatureTask, phase: str, where: str) -> list[Any]:
        if task.read_ahead is not None:
            self.reads_ahead_used += 1
            logger.info(f"shard {task.shard_id}: using the rows read ahead")
            tables = task.read_ahead
        else:
            tables = read_tables(task.source, self.rows)
        return with_drop_columns(tables, task.drops, marked_stages(self.stages, phase), where)

    def __call__(self, task: ShardTask) -> ShardOutput:
        return self._attempt(task, f"shard {task.shard_id}", FINAL, self._write_output)

    def signatures(self, task: SignatureTask) -> SignatureOutput:
        """Shard ``task.shard_id``'s signature phase of dedup stage ``task.stage``: the operators before
        its deduplicator (earlier stages' drops applied), the deduplicator's own ``compute_hash``, the
        rows that reached it and their keys (``dedup_runner.collect_signatures``)."""
        if not 1 <= task.stage <= len(self.stages):
            raise ElasticError(f"the recipe has {len(self.stages)} dedup stage(s), not stage {task.stage}")
        stage = self.stages[task.stage - 1]
        where = f"shard {task.shard_id}, dedup {stage.number}/{len(self.stages)} {stage.op_name}: signatures"

        def finish(
            task: SignatureTask, attempt_dir: Path, where: str, cfg: Any, result: Any, quarantined: Any, t0: float
        ):
            data = result.data
            found = collect_signatures(
                data.iter_batches(batch_size=None, batch_format="pyarrow"), stage, where, quarantined.path
            )
            logger.info(
                f"{where}: {len(found.rows)} of {task.input_rows} rows reached the deduplicator "
                f"({found.keys.shape[1]} band(s)) in {time.monotonic() - t0:.2f}s"
            )
            return found

        return self._attempt(task, where, signature_phase(stage.number), finish)

    def _attempt(self, task: Any, where: str, phase: str, finish: Callable[..., Any]) -> Any:
        attempt_dir = Path(task.attempt_dir)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        log_path = attempt_dir / LOG_FILE
        tracker = heartbeats.current()  # the worker loop's live progress of this attempt, if any
        with attempt_log(log_path), ray_job_env(), _preserve_order(), ray_data_progress(tracker):
            logger.info(
                f"{where}: attempt {task.attempt_id} (generation {task.generation}), "
                f"{task.input_rows} input rows from {task.source.display}"
            )
            try:
                return self._run(task, attempt_dir, where, phase, finish)
            except BaseException as exc:
                self.warm.drop(f"{where} failed")  # a failed shard never leaves its operators to the next
                if isinstance(exc, ElasticError):
                    logger.error(f"{where}: attempt {task.attempt_id} failed: {exc}")
                    raise
                if not isinstance(exc, Exception):
                    raise  # a signal or exit: the worker loop releases the claim
                logger.opt(exception=exc).error(f"{where}: attempt {task.attempt_id} failed")
                raise ShardExecutionError(
                    f"Data-Juicer failed: {last_meaningful_line(exc)}",
                    where=where,
                    hint=f"full traceback in {log_path}",
                ) from exc

    def _run(self, task: Any, attempt_dir: Path, where: str, phase: str, finish: Callable[..., Any]) -> Any:
        import ray

        if not ray.is_initialized():
            raise ElasticError(
                "no Ray runtime is connected in this process",
                where=where,
                hint="run shards inside execution.ray_runtime.WarmRayRuntime, or use LazyShardRunner",
            )
        overrides = {
            # only a key (``shard_reader.shard_source`` serves the shard), but Data-Juicer shlex-splits it into
            # weighted paths: quoted, a job_dir with spaces or quotes stays one path
            "dataset_path": shlex.quote(str(shard_key(attempt_dir))),
            # RayExecutor builds its exporter even when it does not export: a path it never writes
            "export_path": str(attempt_dir / "ray-output"),
            "export_type": "jsonl",
            "work_dir": str(attempt_dir / "work"),
            "job_id": task.attempt_id,
            # the warm runtime's own address: Data-Juicer's initialize_ray then
            # returns the existing connection instead of resolving "auto"
            "ray_address": ray.get_runtime_context().gcs_address,
        }
        cfg = self._configs(phase).load(overrides, attempt_dir / "recipe.yaml")
        with self.warm.active():  # load_ops returns this process's warm operators (warm_ops)
            return self._run_warm(task, attempt_dir, where, cfg, phase, finish)

    def close(self) -> None:  # before the Ray runtime stops: the warm actors live in it
        self.warm.drop()

    def _run_warm(
        self, task: Any, attempt_dir: Path, where: str, cfg: Any, phase: str, finish: Callable[..., Any]
    ) -> Any:
        import ray

        manifest = self._manifests.get(phase)
        if manifest is None:
            manifest = self._manifests[phase] = manifest_from_cfg(cfg)
        ids = stage_ids(manifest)
        expected = phase_stage_ids(self.expected_stage_identities, ids, phase) if self.stages else None
        expected = self.expected_stage_identities if expected is None else expected
        verify_stage_identities(expected, ids, where=where)
        write_identity_record(attempt_dir / "stage_identities.json", manifest, expected)
        # Where RayExecutor keeps them (it recomputes them only under
        # elastic_juicer_adaptive_batching, checked below).
        dj_ops_internals.stamp(cfg, manifest)

        t0 = time.monotonic()
        # The shard as this package reads it (row schema, row numbers), read once and checked
        # against its scan before Data-Juicer sees a row (drop columns marked), then materialized for RayExecutor.
        tables = self._tables(task, phase, where)
        batching = _start_batching(task, cfg, manifest)
        try:
            with shard_source(shard_key(task.attempt_dir), lambda: ray.data.from_arrow(tables)):
                result = dj_ops_internals.run_unexported(cfg)
        finally:
            _finish_batching(batching, task)
        _check_stamped(cfg, ids, where)
        # the rows operators failed on, set aside (quarantine): over the limit, fail
        quarantined = fold_errors(
            attempt_dir, task.shard_id, lambda: iter_source_lines(task.source), lambda: task.source.first_row
        )
        check_limit(quarantined, self.max_error_rows, task.input_rows, where)
        return finish(task, attempt_dir, where, cfg, result, quarantined, t0)

    def _write_output(
        self, task: ShardTask, attempt_dir: Path, where: str, cfg: Any, result: Any, quarantined: Any, t0: float
    ) -> ShardOutput:
        note_stage(heartbeats.current(), heartbeats.Stage.CANONICALIZING)
        stats = ShardStatsRecorder(task.shard_id, task.attempt_id, attempt_dir)
        data = result.data
        inputs = InputRows(task.source)
        try:
            written = write_shard(
                data.iter_batches(batch_size=None, batch_format="pyarrow"),
                data.columns(),
                inputs,
                task.output_path,
                attempt_dir / ROW_STATS_FILE,
                ExportLayout.from_cfg(cfg),
                on_row=stats.observe,
            )
            inputs.finish()  # the rows the writer took came from the scanned content (checked to its end)
        finally:
            inputs.close()
        out = written.output
        note_stage(heartbeats.current(), heartbeats.Stage.CANONICALIZING, rows_written=out.rows)
        stats_path = stats.write(out.rows, out.sha256)
        logger.info(f"{where}: {out.rows} of {task.input_rows} rows out in {time.monotonic() - t0:.2f}s -> {out.path}")
        if quarantined.rows:
            logger.warning(f"{where}: {quarantined.rows} row(s) set aside -> {quarantined.path}")
        return ShardOutput(
            output_path=out.path,
            rows=out.rows,
            bytes=out.bytes,
            sha256=out.sha256,
            stats_path=stats_path,
            row_stats_path=None if written.row_stats is None else written.row_stats.path,
            errors_path=quarantined.path,
        )


def _start_batching(task: Any, cfg: Any, manifest: Mapping[str, Any]) -> Path | None:
    """Tell the operators in Ray workers which attempt they serve (adaptive batching's profiles and
    traces, the quarantine's records), through the config's work_dir (every operator's own, see
    batching.runtime).  A shard attempt of a job directory shares the job's profiles; any other attempt
    directory (a dedup phase's, a test's) gets its own records, and profiles only when a job directory
    holds it.  Returns the attempt directory, or None when no context could be written."""
    attempt_dir = Path(task.attempt_dir)
    try:
        layout = JobLayout(attempt_dir.parents[2]) if len(attempt_dir.parents) > 2 else None
        if layout is not None and layout.attempt_dir(task.shard_id, task.attempt_id) == attempt_dir:
            job_dir, own_dir = str(layout.root), None
        else:
            holder = next((p for p in attempt_dir.parents if JobLayout(p).manifest.is_file()), None)
            job_dir, own_dir = ("" if holder is None else str(holder)), str(attempt_dir)
        context = BatchingContext(
            job_dir=job_dir,
            shard_id=task.shard_id,
            attempt_id=task.attempt_id,
            stages=[StageRef(s["stage_id"], s["op_fingerprint"]) for s in manifest.get("stages", [])],
            attempt_dir=own_dir,
        )
        write_context(cfg.work_dir, context)
    except (OSError, ElasticError, KeyError, TypeError) as exc:
        logger.warning(f"shard {task.shard_id}: adaptive batching runs without shared profiles: {exc}")
        return None
    return attempt_dir


def _finish_batching(attempt_dir: Path | None, task: Any) -> None:
    """Fold the attempt's size traces into attempt_dir/batching.json (read into attempt.json)."""
    if attempt_dir is None:
        return

    try:
        summary = summarize_attempt(attempt_dir / "batching")
        if summary is not None:
            fsio.atomic_write(
                attempt_dir / "batching.json",
                json.dumps(summary, sort_keys=True, allow_nan=False).encode("utf-8") + b"\n",
                durable=False,
            )
            logger.info(
                f"shard {task.shard_id}: adaptive batching recovered {summary['ooms']} OOM(s) "
                f"({summary['retries']} retries)"
            )
    except (OSError, ElasticError, ValueError) as exc:
        logger.warning(f"shard {task.shard_id}: could not summarise adaptive batching telemetry: {exc}")


def _check_stamped(cfg: Any, ids: list[str], where: str) -> None:
    """Under adaptive batching RayExecutor stamps identities itself: they must be ours."""
    stamped = dj_ops_internals.stamped(cfg)
    if cfg.get("elastic_juicer_adaptive_batching", False) and stamped is not None and stage_ids(stamped) != ids:
        raise IntegrationError(
            f"RayExecutor stamped stage identities {stage_ids(stamped)} but this package computed {ids}",
            where=where,
            hint=f"Data-Juicer changed how it loads operators; check {DATA_JUICER_REQUIREMENT}",
        )


@contextlib.contextmanager
def _preserve_order() -> Iterator[None]:
    # Ray Datasets copy the current DataContext when created, so this must be
    # set before RayExecutor loads the shard.
    from ray.data import DataContext

    options = DataContext.get_current().execution_options
    previous = options.preserve_order
    options.preserve_order = True
    try:
        yield
    finally:
        options.preserve_order = previous


# "ValueError: ...", "ray.exceptions.RayTaskError(UserCodeException): ..."
_EXCEPTION_LINE: Final = re.compile(
    r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout|Killed)\w*)(?:\([\w.]*\))?:\s"
)


def last_meaningful_line(exc: BaseException, limit: int = 400) -> str:
    """The operator-level error line of a (Ray-wrapped) exception, e.g. ``ValueError: bad row``.

    Ray's RayTaskError/UserCodeException says only "UDF failed to process a data block"; the
    original line is in the formatted chain, root cause first.  Prefer the first non-Ray exception
    line, then the last Ray one, then the last line of the message."""
    text = "".join(traceback.format_exception(exc)) + "\n" + str(exc)
    own = wrapped = None
    for raw in text.splitlines():
        line = raw.strip()
        match = _EXCEPTION_LINE.match(line)
        if match is None:
            continue
        name = match["name"]
        if name.startswith("ray.") or name in {"RayTaskError", "UserCodeException"}:
            wrapped = line
        elif own is None:
            own = line
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    chosen = own or wrapped or (f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__)
    return clip(chosen, limit)
