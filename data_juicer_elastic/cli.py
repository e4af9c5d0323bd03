"""``dj-elastic``: the lower-level steps of an elastic sharded job, each a thin wrapper over a library
function (exit codes and messages: docs/failure-semantics.md).  argparse, and neither Ray nor
Data-Juicer is imported unless the subcommand needs it: ``--help`` and ``status`` stay fast.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from data_juicer_elastic import __version__
from data_juicer_elastic.cli_options import (
    FROM_JOB,
    FROM_RECIPE,
    MERGE_OPTIONS,
    PREPARE_OPTIONS,
    RUN_OPTIONS,
    WORKER_OPTIONS,
    add_setting_options,
    given_settings,
)
from data_juicer_elastic.compat import importlib_deferred as deferred
from data_juicer_elastic.console import install_console, say, set_verbose
from data_juicer_elastic.console.log_files import close_log_sinks
from data_juicer_elastic.console.quiet import mark_quiet_workers
from data_juicer_elastic.errors import EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_OK, ElasticError, storage_error
from data_juicer_elastic.integration.config_block import require_elastic, settings_from_cfg
from data_juicer_elastic.integration.driver_files import DRIVER, note_job_dir, parsing, remove_refused_job_dirs
from data_juicer_elastic.jobdir.exports import check_export_path
from data_juicer_elastic.settings import ElasticSettings

# Each subcommand imports the module that does its work when it runs (and no other): a `dj-elastic`
# process does one thing, and the whole package costs it about three times the start-up of
# `--version` (tests/test_architecture.py, DEFERRED_IMPORTS).


def _cmd_prepare(args: argparse.Namespace) -> int:
    from data_juicer_elastic.preparation import early_request, prepare_overlapped, prepare_request

    def parse():
        cfg, settings = _load_recipe(args, setup=False)
        require_elastic(cfg, args.config, "dj-elastic prepare")
        note_job_dir(settings.job_dir)
        return prepare_request(cfg, settings)

    # Planning starts while Data-Juicer loads (seconds): see prepare_overlapped.
    overrides = {"dataset_path": args.dataset_path, **given_settings(args)}
    early = early_request(args.config, overrides)
    if early is not None:
        note_job_dir(early.job_dir)  # before the early pass creates it: a refusal removes it again
    prepare_overlapped(early, parse, scan=args.scan)  # says what it did
    return EXIT_OK


def _cmd_worker(args: argparse.Namespace) -> int:
    from data_juicer_elastic.console.summary import worker_done_line
    from data_juicer_elastic.local_worker import run_local_worker

    settings = _settings_from_job(args.job_dir, args)  # a bad job dir is refused before Ray or Data-Juicer loads
    summary = run_local_worker(
        args.job_dir, settings, wait_for_completion=not args.no_wait, slots=args.slots, max_done=args.max_done
    )
    say(worker_done_line(args.job_dir, summary))
    if summary.terminal_failures:
        failed = ", ".join(shard_id for shard_id, _ in summary.terminal_failures)
        print(f"error: shard(s) failed terminally: {failed}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    from data_juicer_elastic.status.job_view import print_document, status_document, watch

    job = Path(args.job_dir).resolve()
    if args.watch is not None:
        return watch(job, interval=args.watch, as_json=args.json, show_all=args.all, ttl_secs=args.lease_ttl_secs)
    text, code = status_document(job, as_json=args.json, show_all=args.all, ttl_secs=args.lease_ttl_secs)
    print_document(text)
    return code


def _cmd_report(args: argparse.Namespace) -> int:
    from data_juicer_elastic.report.render import write_report

    result = write_report(args.job_dir, args.output)
    how = "activity strips" if result.aggregated else "one bar per attempt"
    print(f"wrote {result.output} ({result.bytes:,} bytes): {result.shards} shards, {result.attempts} attempts ({how})")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    from data_juicer_elastic.executor import ElasticShardedExecutor
    from data_juicer_elastic.integration.dispatch import print_run_summary

    with parsing(DRIVER):  # Data-Juicer's work dir goes under the job directory, as under dj-process
        cfg, _ = _load_recipe(args)
    require_elastic(cfg, args.config, "dj-elastic run")
    executor = ElasticShardedExecutor(cfg)
    result = executor.run()
    if result is None:
        print("reached max_shards; the other instances finish the run")
    print_run_summary(executor, result)
    return EXIT_OK


def _cmd_retry(args: argparse.Namespace) -> int:
    from data_juicer_elastic.integration.retry_command import next_steps, retry

    outcome = retry(
        args.job_dir,
        shard_ids=args.shard_id,
        all_failed=args.all_failed,
        quarantined=args.quarantined,
        accept_code_change=args.accept_code_change,
    )
    print("\n".join(next_steps(args.job_dir, outcome)))
    return EXIT_OK


def _cmd_merge(args: argparse.Namespace) -> int:
    from data_juicer_elastic.finalize import finalize, follow_to_end
    from data_juicer_elastic.jobdir.manifest import recorded_export_path

    job = Path(args.job_dir).resolve()
    layout = _settings_from_job(args.job_dir, args).export_layout  # --export-layout, else the job's setting
    output = args.output or recorded_export_path(job)
    check_export_path(job, output, "--output", layout)  # before anything is read

    if args.follow:
        follow_to_end(job, output, overwrite=args.overwrite, layout=layout, poll_secs=args.poll_secs)
    else:
        finalize(args.job_dir, output, overwrite=args.overwrite, layout=layout)  # says what it merged
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from data_juicer_elastic.shards.verify import verify_job

    print("\n".join(verify_job(Path(args.job_dir).resolve(), expect_nodes=args.expect_nodes).lines()))
    return EXIT_OK


def _cmd_clean(args: argparse.Namespace) -> int:
    from data_juicer_elastic.shards.clean import clean_job

    print("\n".join(clean_job(Path(args.job_dir).resolve()).lines(args.job_dir)))
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    from data_juicer_elastic.integration import doctor

    checks = list(doctor.integration_checks())
    if args.job_dir:
        checks += doctor.filesystem_checks(Path(args.job_dir))
        if Path(args.job_dir).is_dir():
            checks.append(doctor.lease_timing_check(args.job_dir))
    print("\n".join(doctor.report_lines(checks, args.job_dir, verbose=getattr(args, "verbose", False))))
    return EXIT_OK if all(c.ok or c.warn for c in checks) else EXIT_ERROR


def _load_recipe(args: argparse.Namespace, setup: bool = True):
    """Parse a recipe exactly as dj-process does (same parser, same validation); ``setup=False``:
    without Data-Juicer's side effects (work dir, log files, config backup), for commands that only prepare."""
    from data_juicer.config import init_configs

    argv = ["--config", args.config]
    if args.dataset_path:
        argv += ["--dataset_path", args.dataset_path]
    for name, value in given_settings(args).items():
        argv += [f"--elastic.{name}", "true" if value is True else str(value)]
    extra = list(getattr(args, "extra", None) or [])
    argv += extra[1:] if extra[:1] == ["--"] else extra
    cfg = init_configs(args=argv, load_configs_only=not setup)
    return cfg, settings_from_cfg(cfg)


def _settings_from_job(job_dir: str, args: argparse.Namespace):
    """The settings recorded at prepare, with this worker's command-line overrides."""
    from data_juicer_elastic.jobdir.manifest import load_plan

    recorded = dict(load_plan(Path(job_dir).resolve()).settings)
    recorded.pop("run_id", None)  # a submission's identity, not the job's
    recorded.update(given_settings(args))
    recorded["job_dir"] = str(Path(job_dir).resolve())
    return ElasticSettings.from_mapping(recorded)


def build_parser() -> argparse.ArgumentParser:
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # so that -v before or after the command both count
        help="show everything Data-Juicer and Ray log (also DJ_ELASTIC_VERBOSE=1); default: the plugin's own "
        "lines, warnings, errors and a live progress line",
    )
    # Plain text, not the module docstring: argparse prints it as it is (reST markup would show).
    description = "dj-elastic: the lower-level steps of an elastic sharded job."
    parser = argparse.ArgumentParser(prog="dj-elastic", description=description, parents=[verbose])
    parser.add_argument("--version", action="version", version=f"data-juicer-elastic {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_parser = functools.partial(sub.add_parser, parents=[verbose])

    def job_dir(p: argparse.ArgumentParser, required: bool = True) -> None:
        p.add_argument("--job-dir", required=required, help="the shared job directory")

    p = add_parser(
        "prepare",
        help="validate the recipe, list the input and plan its shards (idempotent; the workers scan the data)",
    )
    p.add_argument("--config", required=True, help="Data-Juicer recipe (YAML) with executor_type elastic_sharded")
    p.add_argument("--dataset-path", help="override the recipe's dataset_path")
    p.add_argument(
        "--scan",
        action="store_true",
        help="also scan every shard here (check every row now, serially on this node); default: the workers scan",
    )
    job_dir(p, required=False)
    add_setting_options(p, PREPARE_OPTIONS, FROM_RECIPE)
    p.set_defaults(func=_cmd_prepare)

    p = add_parser(
        "run",
        help="the whole job on this node, as dj-process does: elected prepare, work, elected finalize",
        description="Start the same command on every node of a submission (all instances of one submission "
        "share a run id: elastic.run_id, DJ_ELASTIC_RUN_ID or the scheduler's job id). Further "
        "dj-process options may follow after --, e.g. -- --elastic.max_retries 1",
    )
    p.add_argument("--config", required=True, help="Data-Juicer recipe (YAML) with executor_type elastic_sharded")
    p.add_argument("--dataset-path", help="override the recipe's dataset_path")
    job_dir(p, required=False)
    add_setting_options(p, RUN_OPTIONS, FROM_RECIPE, flags={"slots_per_node": "--slots"})
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then further dj-process options")
    p.set_defaults(func=_cmd_run)

    p = add_parser("worker", help="claim and process shards with one warm node-local Ray runtime")
    job_dir(p)
    add_setting_options(p, WORKER_OPTIONS, FROM_JOB)
    p.add_argument(
        "--slots",
        type=int,
        dest="slots",
        help="shards this node processes at once, one worker process and Ray runtime each; with GPUs listed "
        "in CUDA_VISIBLE_DEVICES every slot gets its own subset (default: elastic.slots_per_node)",
    )
    p.add_argument("--max-done", type=int, help=argparse.SUPPRESS)  # strict mode's share, for slot processes
    p.add_argument("--no-wait", action="store_true", help="exit when nothing is claimable instead of waiting")
    p.set_defaults(func=_cmd_worker)

    p = add_parser(
        "status",
        help="show progress: states, rows, rows/s, ETA, nodes, stragglers, failures (never changes the job)",
        description="Exit code 0: every shard done; 1: incomplete; 2: a shard failed terminally or an error. "
        "The --json schema is documented in docs/status.md.",
    )
    job_dir(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (versioned schema, docs/status.md)")
    p.add_argument("--all", action="store_true", help="list every shard, with what its records say (reads them all)")
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=5.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 5) until the job is complete or Ctrl-C; with --json one JSON per line",
    )
    add_setting_options(p, {"lease_ttl_secs": "only affects which claims display as stale"}, FROM_JOB)
    p.set_defaults(func=_cmd_status)

    p = add_parser(
        "report", help="write one self-contained HTML report: timeline, throughput, failures (never changes the job)"
    )
    job_dir(p)
    p.add_argument("--output", required=True, help="the HTML file to write (outside the job directory)")
    p.set_defaults(func=_cmd_report)

    p = add_parser(
        "retry",
        help="requeue terminally failed shards, done shards whose output is missing or corrupt, or (--quarantined) "
        "done shards that set rows aside (archives their records to history/)",
    )
    job_dir(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--all-failed",
        action="store_true",
        help="every terminally failed shard: its records are archived to history/ and the next worker runs it again",
    )
    group.add_argument(
        "--shard-id",
        nargs="+",
        metavar="ID",
        help="these shards (ids as status lists them, e.g. part-00003-of-00008): each must be terminally failed, "
        "or done with its output missing or corrupt",
    )
    group.add_argument(
        "--quarantined",
        action="store_true",
        help="every done shard with quarantined rows, to run again whole after a fix (docs/quarantine.md)",
    )
    p.add_argument(
        "--accept-code-change",
        action="store_true",
        help="the operator code was fixed: the requeued shards run this node's code (recorded in code-changes/; "
        "every other shard must be done)",
    )
    p.set_defaults(func=_cmd_retry)

    p = add_parser("merge", help="validate every shard result and merge them in input order (or publish parts)")
    job_dir(p)
    p.add_argument(
        "--output",
        help="the merged JSONL to write (with parts: the directory); default: the export_path of the recipe the "
        "job was prepared from",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a different existing output")
    p.add_argument(
        "--follow",
        action="store_true",
        help="merge while workers run: append each shard to OUTPUT.partial as soon as all before it are done, "
        "recording the final prefix in OUTPUT.progress.json (resumes after a crash)",
    )
    p.add_argument("--poll-secs", type=float, default=2.0, help="with --follow: how often to look for the next shard")
    add_setting_options(p, MERGE_OPTIONS, FROM_JOB)
    p.set_defaults(func=_cmd_merge)

    p = add_parser(
        "verify", help="check every shard result, how many nodes completed shards, and the export (either layout)"
    )
    job_dir(p)
    p.add_argument("--expect-nodes", type=int, default=1, help="minimum distinct node identities among completions")
    p.set_defaults(func=_cmd_verify)

    p = add_parser(
        "clean",
        help="remove the shard outputs of a finished job whose export verifies, keeping the output once "
        "(verify, status, report and reruns still work; retry and a merge elsewhere refuse)",
    )
    job_dir(p)
    p.set_defaults(func=_cmd_clean)

    p = add_parser("doctor", help="check the Data-Juicer integration and a shared directory")
    job_dir(p, required=False)
    p.set_defaults(func=_cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _console(getattr(args, "verbose", False))
    try:
        return args.func(args)
    except ElasticError as err:
        _fail(err)
        return err.exit_code
    except BrokenPipeError:  # the reader left (`| head`): no storage fault
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # a filesystem that refused a write no step turned into its own error
        _fail(storage_error(exc, "", "run the command again"))
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_ERROR


def _fail(err: ElasticError) -> None:
    """The one error line, the last one (log sinks closed first: what they report comes before)."""
    close_log_sinks()
    remove_refused_job_dirs()  # a job dir this refused command created, nothing run in it
    print(f"error: {err}", file=sys.stderr)


def _console(verbose: bool) -> None:
    """Quiet console unless -v (inherited by slot processes through the environment).

    Importing Data-Juicer (lazily, in worker/run/prepare) replaces loguru's handlers
    with its own stderr one, so the console is installed again right after that import."""
    if verbose:
        set_verbose()
    mark_quiet_workers()
    install_console()
    deferred.when_imported("data_juicer", lambda _module: install_console())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
