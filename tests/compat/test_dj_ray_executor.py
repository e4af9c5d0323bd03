"""compat.dj_ray_executor: its self-check passes against the installed packages, and fails naming
``RayExecutor.run`` when it is missing or no longer takes ``skip_export`` (the shard runner writes
the rows itself)."""

from __future__ import annotations

import pytest

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.compat import dj_ray_executor
from data_juicer_elastic.errors import IntegrationError


def test_self_check():
    assert "skip_export=False" in dj_ray_executor.self_check()


def test_a_missing_executor_fails_the_self_check(monkeypatch):
    import data_juicer.core.executor.ray_executor as module

    monkeypatch.delattr(module, "RayExecutor")
    with pytest.raises(IntegrationError) as info:
        dj_ray_executor.self_check()
    assert f"{dj_ray_executor.TARGET} is missing" in str(info.value) and DATA_JUICER_REQUIREMENT in str(info.value)


@pytest.mark.parametrize(
    "run",
    [
        lambda self, load_data_np=None: None,  # no skip_export
        lambda self, load_data_np=None, skip_export=True, skip_return=False: None,  # exports unless told
        lambda self, load_data_np=None, skip_export=False: None,  # no skip_return
    ],
)
def test_a_changed_run_fails_the_self_check(monkeypatch, run):
    from data_juicer.core.executor.ray_executor import RayExecutor

    monkeypatch.setattr(RayExecutor, "run", run)
    with pytest.raises(IntegrationError, match=r"RayExecutor.run no longer takes skip_(export|return)=False"):
        dj_ray_executor.self_check()


def test_run_unexported_builds_ray_executor_and_skips_the_export(monkeypatch):
    from data_juicer.core.executor.ray_executor import RayExecutor

    calls = []

    def run(self, load_data_np=None, skip_export=False, skip_return=False):
        calls.append((self.cfg, skip_export, skip_return))
        return "dataset"

    monkeypatch.setattr(RayExecutor, "__init__", lambda self, cfg: setattr(self, "cfg", cfg))
    monkeypatch.setattr(RayExecutor, "run", run)
    assert dj_ray_executor.run_unexported("cfg") == "dataset"
    assert calls == [("cfg", True, False)]
