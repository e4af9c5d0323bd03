"""batching.demo: importing it (or any batching or quarantine module) loads no engine; the operator is
defined and registered once, on first use, and instances pickle as Ray pickles them (cloudpickle), the
class by reference, also into a fresh process that has not imported Data-Juicer (a Ray worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("data_juicer")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run_python(code: str, stdin: bytes = b"") -> str:
    proc = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return proc.stdout.decode().strip().splitlines()[-1]


def test_importing_batching_and_quarantine_loads_no_engine():
    names = sorted(
        ".".join(path.with_suffix("").relative_to(ROOT).parts).removesuffix(".__init__")
        for package in ("batching", "quarantine")
        for path in (ROOT / "data_juicer_elastic" / package).glob("*.py")
    )
    assert "data_juicer_elastic.batching.demo" in names
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'data_juicer', 'torch'))))"
    )
    assert json.loads(run_python(code)) == []


def test_the_class_is_registered_once_and_is_the_modules_attribute():
    from data_juicer.ops.base_op import OPERATORS

    from data_juicer_elastic.batching import demo

    cls = demo.register()
    assert demo.register() is cls and demo.ElasticOomDemoMapper is cls and OPERATORS.modules[demo.NAME] is cls
    assert cls.__module__ == demo.__name__ and cls.__qualname__ == demo.CLASS_NAME
    assert cls.process_batched.__qualname__ == f"{demo.CLASS_NAME}.process_batched"
    with pytest.raises(AttributeError, match="no_such_name"):
        demo.no_such_name  # noqa: B018


def test_an_instance_unpickles_in_a_process_that_never_imported_data_juicer():
    from data_juicer.ops.base_op import OPERATORS
    from ray import cloudpickle

    from data_juicer_elastic.batching.demo import NAME

    op = OPERATORS.modules[NAME](capacity=123, batch_size=4, torch_errors=False)
    data = cloudpickle.dumps(op)
    assert b"data_juicer_elastic.batching.demo" in data and b"_define" not in data  # the class by reference
    code = (
        "import json, pickle, sys\n"
        "op = pickle.loads(sys.stdin.buffer.read())\n"
        "from data_juicer.ops.base_op import OPERATORS\n"
        "from data_juicer_elastic.batching import demo\n"
        "out = op.process_batched({'text': ['ab', 'cde']})\n"
        "print(json.dumps([type(op) is OPERATORS.modules[demo.NAME], op.capacity, out['demo_chars']]))"
    )
    assert json.loads(run_python(code, data)) == [True, 123, [2, 3]]
