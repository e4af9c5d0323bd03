"""compat/: every module is registered, tested and run by ``dj-elastic doctor``; importing the
package is cheap; the supported ranges it names are the ones setup.cfg installs."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

from data_juicer_elastic import DATA_JUICER_REQUIREMENT, compat

ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = ROOT / "data_juicer_elastic" / "compat"


def test_every_compat_module_is_registered_and_has_a_test():
    on_disk = sorted(p.stem for p in COMPAT_DIR.glob("*.py") if p.stem != "__init__")
    assert sorted(compat.MODULES) == on_disk
    untested = [name for name in compat.MODULES if not (Path(__file__).parent / f"test_{name}.py").is_file()]
    assert not untested


def test_every_self_check_passes():
    failed = {name: result for name, result in compat.self_checks() if not isinstance(result, str)}
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
    for name in compat.MODULES:
        assert any(line.startswith(f"[ok] compat {name}: ") for line in lines), (name, proc.stdout[-3000:])


def test_a_failing_self_check_fails_doctor(monkeypatch):
    from data_juicer_elastic.compat import ray_services
    from data_juicer_elastic.integration.doctor import integration_checks

    def moved():
        raise compat.ray_moved("ray._private.services.canonicalize_bootstrap_address is missing")

    monkeypatch.setattr(ray_services, "self_check", moved)
    failed = [c for c in integration_checks() if not c.ok]
    assert [c.name for c in failed] == ["compat ray_services"]
    assert "canonicalize_bootstrap_address" in failed[0].detail and compat.RAY_REQUIREMENT in failed[0].detail


def test_importing_compat_imports_neither_ray_nor_data_juicer():
    code = (
        "import json, sys; import data_juicer_elastic.compat; "
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
    assert compat.RAY_REQUIREMENT in requires
    from data_juicer_elastic.compat.ddsketch_store import REQUIREMENT as DDSKETCH_REQUIREMENT

    assert DDSKETCH_REQUIREMENT in requires
