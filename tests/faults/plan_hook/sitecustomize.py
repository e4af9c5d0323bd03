"""Test aid, first on ``PYTHONPATH`` of the processes a fault test starts (``dj-process``,
``dj-elastic``, ``python -m tests.faults.driver``, the slot workers they start): Python imports
this module when the interpreter starts, and it installs the fault plan and crash point that
``DJ_ELASTIC_TEST_FAULTS`` / ``DJ_ELASTIC_TEST_CRASH_AT`` name (``tests.faults.crashpoints``),
so the package itself holds no test hook.

- Another ``sitecustomize`` later on the path (the machine's own, or another test aid) runs
  first: Python imports only the first one it finds, so this one executes the next.
- Ray's own processes (its workers and daemons, started from a Ray runtime of the process under
  test) get no plan: a plan names the points of the process the test starts.
- A bad plan is the one ``error: ...`` line and exit 2 (what ``dj-elastic`` does for bad
  settings), never a run without the faults it asked for.
"""

import importlib.machinery
import importlib.util
import os
import sys

_CRASH_ENV, _FAULTS_ENV = "DJ_ELASTIC_TEST_CRASH_AT", "DJ_ELASTIC_TEST_FAULTS"


def _run_the_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _is_rays_own_process() -> bool:
    script = (getattr(sys, "argv", None) or [""])[0]  # "-c" / "-m" until the interpreter runs them
    if script in ("", "-c", "-m"):
        return False
    return "ray" in os.path.abspath(script).split(os.sep)[:-1]  # .../ray/_private/workers/default_worker.py


def _install() -> None:
    if not (os.environ.get(_CRASH_ENV) or os.environ.get(_FAULTS_ENV)) or _is_rays_own_process():
        return
    try:
        from tests.faults import crashpoints

        crashpoints.install_from_env()
    except Exception as exc:  # a bad plan, or this checkout not on the path: the process must not run without it
        sys.stderr.write(f"error: fault plan hook: {exc}\n")
        sys.stderr.flush()
        os._exit(2)


_run_the_next_sitecustomize()
_install()
