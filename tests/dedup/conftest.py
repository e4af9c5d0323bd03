"""The deduplication tests check rows, records and refusals, not durability: fsync is a no-op here (a
parity example publishes a few hundred files, and their fsyncs were most of its time)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)
