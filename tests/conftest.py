"""Order of the test files for the process pool (pytest-xdist, `--dist loadfile`): the files that run the
real commands on Ray come first, then the other end-to-end and Ray files, then the rest, each group in
collection order. A file's tests stay together and keep their order; only whole files move.

Files go to the test processes in this order, one at a time as a process runs short of work. The few
files that each hold one long end-to-end run (a `default`-executor oracle and an `elastic_sharded` job
with its own Ray) then run beside the many short files instead of alone at the end of the run."""

from __future__ import annotations

import os

import pytest


def _rank(item: pytest.Item) -> int:
    marks = {mark.name for mark in item.iter_markers()}
    if {"e2e", "ray"} <= marks:
        return 0
    return 1 if marks & {"e2e", "ray", "slow"} else 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    files: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        files[path] = min(files.get(path, 2), _rank(item))
    order = {path: (rank, index) for index, (path, rank) in enumerate(files.items())}
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process more than the machine has cores.  The end-to-end tests wait on
    the commands they run (Ray starting, workers polling, a shard's sleep) about a quarter of the
    time, and a third process fills those waits: on 2 cores 7.4 min for the default tier against
    8.8 min with two."""
    return (os.cpu_count() or 1) + 1
