"""A worker (or merger) process for fault tests: the real worker loop, lease code and
fault seam, with the fast fake runner instead of Ray.

    python -m tests.faults.driver worker JOB [--ttl 2 --heartbeat 0.5 --sleep 1 ...]
    python -m tests.faults.driver merge JOB OUTPUT [--layout parts]
    python -m tests.faults.driver follow JOB OUTPUT                (the streaming merge)
    python -m tests.faults.driver prepare JOB INPUT --shards N [--plan-only]
    python -m tests.faults.driver run JOB INPUT OUTPUT --run-id ID [--layout parts]   (elected prepare/finalize)

``--dedup`` (worker, prepare, run): the recipe ``fakes.DEDUP_PROCESS`` (a filter, two exact deduplicators),
its phases run with the fake signature runner (``fakes.fake_signatures``) and its shards with
``fakes.dedup_runner``.

Like ``dj-elastic``: runs with the fault plan / crash point named by the environment (installed
at start by ``plan_hook/sitecustomize.py``, see ``crashpoints``), prints one ``error: ...`` line and exits 2 on an
ElasticError or a terminally failed shard, prints the summary as JSON on success.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from types import SimpleNamespace

from data_juicer_elastic.coordination.run import Outcome
from data_juicer_elastic.dedup.phases import dedup_phases
from data_juicer_elastic.errors import EXIT_ERROR, ElasticError
from data_juicer_elastic.job_run import JobRun
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.settings import ElasticSettings
from data_juicer_elastic.shards.merge import follow_merge, merge_job
from data_juicer_elastic.shards.parts import publish_parts
from data_juicer_elastic.shards.prepare import PrepareRequest, plan_job, prepare_job
from data_juicer_elastic.shards.scan import ShardScanner
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .fakes import DEDUP_PROCESS, dedup_runner, fake_signatures, fsio_runner, pause


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker")
    w.add_argument("job")
    w.add_argument("--ttl", type=float, default=60.0)
    w.add_argument("--heartbeat", type=float, default=None)
    w.add_argument("--poll", type=float, default=0.05)
    w.add_argument("--retries", type=int, default=3)
    w.add_argument("--sleep", type=float, default=0.0, help="seconds per shard")
    w.add_argument("--rows-late", action="store_true", help="no row read for the first 2/3 of --sleep")
    w.add_argument("--fail", default=None, help="a shard id the runner always fails")
    w.add_argument("--no-wait", action="store_true")
    w.add_argument("--max-shards", type=int, default=None)
    w.add_argument("--scan-sleep", type=float, default=0.0, help="seconds each scan waits before it reads")
    w.add_argument("--dedup", action="store_true")
    w.add_argument("--hash-fails", default="", help="input row ids (comma-separated) whose stage-1 hashing raises")
    m = sub.add_parser("merge")
    m.add_argument("job")
    m.add_argument("output")
    m.add_argument("--layout", choices=["file", "parts"], default="file")
    f = sub.add_parser("follow", help="the streaming merge (merge --follow) of a finished job")
    f.add_argument("job")
    f.add_argument("output")
    p = sub.add_parser("prepare")
    p.add_argument("job")
    p.add_argument("input")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--plan-only", action="store_true", help="publish the plan; the workers scan")
    p.add_argument("--dedup", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("job")
    r.add_argument("input")
    r.add_argument("output")
    r.add_argument("--run-id", required=True)
    r.add_argument("--shards", type=int, default=4)
    r.add_argument("--ttl", type=float, default=60.0)
    r.add_argument("--layout", choices=["file", "parts"], default="file")
    r.add_argument("--dedup", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            if args.plan_only:
                planned = plan_job(_request(args))
                print(json.dumps({"created": planned.created, "job_id": planned.plan.job_id}))
                return 0
            outcome = prepare_job(_request(args))
            print(json.dumps({"created": outcome.created, "job_id": outcome.manifest.job_id}))
            return 0
        if args.command == "run":
            print(json.dumps(_run(args)))
            return 0
        if args.command in ("merge", "follow"):
            if args.command == "merge" and args.layout == "parts":
                result = publish_parts(args.job, args.output)
            elif args.command == "merge":
                result = merge_job(args.job, args.output)
            else:
                result = follow_merge(args.job, args.output, wait=False)
            print(json.dumps({"rows": result.rows, "written": result.written, "sha256": result.sha256}))
            return 0
        fail = (lambda task: task.shard_id == args.fail) if args.fail else None
        summary = run_worker(
            args.job,
            WorkerIdentity.current(),
            dedup_runner(DEDUP_PROCESS) if args.dedup else fsio_runner(args.sleep, fail, rows_late=args.rows_late),
            WorkerSettings(
                ttl_secs=args.ttl,
                heartbeat_secs=args.heartbeat or args.ttl / 4,
                max_retries=args.retries,
                poll_interval_secs=args.poll,
                wait_for_completion=not args.no_wait,
                max_shards=args.max_shards,
            ),
            sleep=pause,
            run_scan=_slow_scanner(args.scan_sleep),  # a planned job is scanned first, by every worker
            phases=dedup_phases(fake_signatures(DEDUP_PROCESS, {int(i) for i in args.hash_fails.split(",") if i})),
        )
    except ElasticError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps(asdict(summary)), flush=True)
    if summary.terminal_failures:
        print(f"error: shard(s) failed terminally: {summary.terminal_failures}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _slow_scanner(seconds: float):
    """The real scanner, each scan started ``seconds`` late (a slow read, for takeover tests)."""
    scanner = ShardScanner(processes=0)
    if not seconds:
        return scanner

    def scan(task):
        pause(seconds)
        return scanner(task)

    return scan


def _request(args) -> PrepareRequest:
    return PrepareRequest(
        job_dir=args.job, dataset_path=args.input, num_shards=args.shards,
        recipe={"process": DEDUP_PROCESS if args.dedup else [{"copy_mapper": None}]}, stage_identities=["copy"],
    )  # fmt: skip


class FakeJobRun(JobRun):
    """dj-process's own run (elections, abort, outcome, leave records, finalize), with the fake
    runner in place of Ray and the driver's request in place of a Data-Juicer recipe."""

    def __init__(self, args):
        settings = ElasticSettings(
            job_dir=args.job, num_shards=args.shards, lease_ttl_secs=args.ttl, poll_interval_secs=0.05,
            max_retries=1, wait_timeout_secs=600.0, run_id=args.run_id, export_layout=args.layout,
        )  # fmt: skip
        super().__init__(SimpleNamespace(dataset_path=args.input, export_path=args.output), settings)
        self.args = args
        self.outcome: Outcome | None = None

    def prepare(self) -> tuple:
        outcome = plan_job(_request(self.args))
        print(json.dumps({"prepared": outcome.created}), flush=True)
        return outcome.plan, outcome.created

    def check_prepared(self, plan) -> None:
        pass  # every instance was started with the same arguments: the same request

    def run_shards(self, stop, max_done):
        s = self.settings
        return run_worker(
            self.layout.root,
            self.identity,
            dedup_runner(DEDUP_PROCESS) if self.args.dedup else fsio_runner(),
            WorkerSettings(
                ttl_secs=s.lease_ttl_secs,
                heartbeat_secs=s.heartbeat_secs,
                max_retries=s.max_retries,
                poll_interval_secs=s.poll_interval_secs,
                max_done=max_done,
            ),
            stop_event=stop,
            run_scan=ShardScanner(processes=0),
            phases=dedup_phases(fake_signatures(DEDUP_PROCESS)),
        )

    def report(self, outcome):
        self.outcome = outcome
        return super().report(outcome)


def _run(args) -> dict:
    """The coordinated flow dj-process runs (elections, abort, outcome), with the fake runner."""
    run = FakeJobRun(args)
    run.run()
    outcome = run.outcome
    return {"finalized_by": outcome.instance.instance_id, "me": run.coordinator.instance_id, **outcome.details}


if __name__ == "__main__":
    sys.exit(main())
