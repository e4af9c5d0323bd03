"""The hook that installs a fault plan in the processes a test starts (``plan_hook/sitecustomize.py``):
Python really runs it at start, it chains to any other sitecustomize, a bad plan stops the process,
Ray's own processes get no plan, and the package itself holds no test hook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import driver_env
from .crashpoints import CRASH_ENV, FAULTS_ENV, HOOK_DIR, REPO, hooked_pythonpath

# A file operation through the package's seam, as the commands perform them.
WRITE = """import sys, pathlib
from data_juicer_elastic.sharedfs import fsio
fsio.write_new(pathlib.Path(sys.argv[1]), b"x")
"""
FULL_DISK = [{"op": "write", "errno": "ENOSPC", "times": None}]


def _python(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_a_started_process_runs_with_the_plan_its_environment_names(tmp_path):
    failed = _python(["-c", WRITE, str(tmp_path / "a")], driver_env(faults=FULL_DISK), tmp_path)
    assert failed.returncode == 1 and "No space left on device (injected: fail write)" in failed.stderr, failed.stderr
    assert not (tmp_path / "a").exists()
    written = _python(["-c", WRITE, str(tmp_path / "b")], driver_env(), tmp_path)
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "b").read_bytes() == b"x"


def test_the_hook_is_the_sitecustomize_python_imports_and_it_runs_the_next_one(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = {**driver_env(faults=FULL_DISK), "PYTHONPATH": hooked_pythonpath(str(other))}
    show = "import os, sitecustomize; print(sitecustomize.__file__, os.environ.get('OTHER_SITECUSTOMIZE_RAN'))"
    shown = _python(["-c", show], env, tmp_path)
    assert shown.stdout.split() == [str(HOOK_DIR / "sitecustomize.py"), "1"], shown.stderr
    failed = _python(["-c", WRITE, str(tmp_path / "a")], env, tmp_path)
    assert failed.returncode == 1 and "injected" in failed.stderr, "the plan is installed as well"


def test_a_bad_plan_is_one_error_line_and_exit_2_not_a_run_without_faults(tmp_path):
    for env in (driver_env(faults=[{"op": "write", "errno": "ENOENT"}]), driver_env(crash="nowhere")):
        proc = _python(["-c", WRITE, str(tmp_path / "a")], env, tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("error: ") and (FAULTS_ENV in line or CRASH_ENV in line), line
        assert not (tmp_path / "a").exists()


def test_rays_own_processes_get_no_plan(tmp_path):
    script = tmp_path / "site-packages" / "ray" / "_private" / "workers" / "default_worker.py"
    script.parent.mkdir(parents=True)
    script.write_text(WRITE)
    proc = _python([str(script), str(tmp_path / "a")], driver_env(faults=FULL_DISK), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a").read_bytes() == b"x"


def test_the_package_holds_no_test_hook():
    package = REPO / "data_juicer_elastic"
    named = [p.relative_to(REPO) for p in package.rglob("*.py") if "DJ_ELASTIC_TEST_" in p.read_text()]
    assert named == [], "the fault plans are installed by the test harness (plan_hook), not the package"
    assert not list(package.rglob("sitecustomize.py")) and not list(package.rglob("usercustomize.py"))
