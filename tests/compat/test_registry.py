"""compat/: every module's checks are in doctor's one table, tested and run by ``dj-elastic doctor``;
importing the package is cheap; the supported ranges it names are the ones setup.cfg installs."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

from data_juicer_elastic import DATA_JUICER_REQUIREMENT, compat
from data_juicer_elastic.compat.targets import RAY_REQUIREMENT, ray_moved
from data_juicer_elastic.integration import doctor

ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = ROOT / "data_juicer_elastic" / "compat"


def test_every_compat_module_is_registered_and_has_a_test():
    on_disk = sorted(p.stem for p in COMPAT_DIR.glob("*.py") if p.stem != "__init__")
    assert sorted(compat.__all__) == on_disk
    # Every module but targets (the helpers each check uses) has checks in the one table.
    checked = {check.__module__.rsplit(".", 1)[-1] for _, check in doctor.COMPAT_CHECKS}
    assert sorted(checked) == [name for name in on_disk if name != "targets"]
    names = [name for name, _ in doctor.COMPAT_CHECKS]
    assert len(set(names)) == len(names)
    untested = [name for name in checked if not (Path(__file__).parent / f"test_{name}.py").is_file()]
    assert not untested
    tests = {name: (Path(__file__).parent / f"test_{name}.py").read_text() for name in checked}
    unchecked = [
        name
        for name, check in doctor.COMPAT_CHECKS
        if f"{check.__name__}()" not in tests[check.__module__.rsplit(".", 1)[-1]]
    ]
    assert not unchecked, "each check is called by its area's test module"


def test_every_self_check_passes():
    failed = {check.name: check.detail for check in doctor.compat_checks() if not check.ok}
    assert not failed


def test_doctor_runs_every_self_check():
    proc = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "doctor", "-v"],  # -v: every check, not the verdict alone
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name, _ in doctor.COMPAT_CHECKS:
        assert any(line.startswith(f"[ok] compat {name}: ") for line in lines), (name, proc.stdout[-3000:])


def test_a_failing_self_check_fails_doctor(monkeypatch):
    def moved():
        raise ray_moved("ray._private.services.canonicalize_bootstrap_address is missing")

    table = [(name, moved if name == "ray_services" else check) for name, check in doctor.COMPAT_CHECKS]
    monkeypatch.setattr(doctor, "COMPAT_CHECKS", table)
    failed = [c for c in doctor.integration_checks() if not c.ok]
    assert [c.name for c in failed] == ["compat ray_services"]
    assert "canonicalize_bootstrap_address" in failed[0].detail and RAY_REQUIREMENT in failed[0].detail


def test_importing_compat_imports_neither_ray_nor_data_juicer():
    code = (
        "import json, sys; import data_juicer_elastic.compat; "
        f"from data_juicer_elastic.compat import {', '.join(compat.__all__)}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'data_juicer'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_setup_cfg_pins_the_supported_ranges():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    requires = [line.strip() for line in parser["options"]["install_requires"].splitlines() if line.strip()]
    assert DATA_JUICER_REQUIREMENT in requires
    assert RAY_REQUIREMENT in requires
    from data_juicer_elastic.compat.ddsketch_store import REQUIREMENT as DDSKETCH_REQUIREMENT

    assert DDSKETCH_REQUIREMENT in requires
