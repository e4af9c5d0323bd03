"""Every dotted name the docs give for our code (``jobdir.task_queue.takeover_reason``,
``heartbeats.StalenessObserver``) names something that exists.

Module names are unique across the package (tests/test_architecture.py), so a name may start
with a package or any module's short name; file names (``merge.json``) and names of other
libraries are not ours and pass.  A rename that forgets the docs fails here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "data_juicer_elastic"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
NAME = re.compile(r"`([a-z_]+(?:\.[A-Za-z_][A-Za-z_0-9]*)+)(?=[`(\s\[])")
FILE_SUFFIXES = (".json", ".jsonl", ".py", ".log", ".csv", ".md", ".yaml", ".gz", ".zst", ".seq")


def short_names() -> dict[str, str]:
    names = {p.stem: ".".join(p.with_suffix("").relative_to(ROOT).parts) for p in PACKAGE.rglob("*.py")}
    names.pop("__init__", None)
    names.update({p.parent.name: ".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.glob("*/__init__.py")})
    return names


def resolves(dotted: str, names: dict[str, str]) -> bool:
    first, *rest = dotted.split(".")
    obj = importlib.import_module(names[first])
    for part in rest:
        found = getattr(obj, part, None)
        if found is None and hasattr(obj, "__path__"):
            try:
                found = importlib.import_module(f"{obj.__name__}.{part}")
            except ImportError:
                found = None
        if found is None:
            return False
        obj = found
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_the_docs_give_for_our_code_exists(doc):
    names = short_names()
    wrong = sorted(
        {
            match.group(1)
            for match in NAME.finditer(doc.read_text())
            if match.group(1).split(".")[0] in names
            and not match.group(1).endswith(FILE_SUFFIXES)
            and not resolves(match.group(1), names)
        }
    )
    assert not wrong, f"{doc.name} names what the code no longer has: {wrong}"
