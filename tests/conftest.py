"""Order of the test files for the process pool (pytest-xdist, `--dist loadfile`): the files that run the
real commands on Ray come first, then the other end-to-end and Ray files, then the rest, each group in
collection order. A file's tests stay together and keep their order; only whole files move.

Files go to the test processes in this order, one at a time as a process runs short of work. The few
files that each hold one long end-to-end run (a `default`-executor oracle and an `elastic_sharded` job
with its own Ray) then run beside the many short files instead of alone at the end of the run."""

from __future__ import annotations

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
