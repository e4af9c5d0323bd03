"""The architecture docs/architecture.md describes, checked on the code itself.

Each rule here is one a newcomer relies on when reading the folder listing: a package only
imports the layers below it, names are unique, exceptions live in ``errors.py``, Data-Juicer's
and Ray's private internals are reached only from ``compat/``, modules stay small.  All of it
is read from the source with ``ast`` (nothing is imported), so a violation names file and line.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "data_juicer_elastic"
# One module per concept: a concept that needs more lines keeps them (no split made only for a cap).
MAX_MODULE_LINES = 600

# Bottom to top.  A package may import its own layer's and lower layers' packages, never a higher
# one (docs/architecture.md, "Layers").  Top-level modules are named by their module name.
LAYERS: list[set[str]] = [
    {"errors"},
    {"sharedfs", "compat"},
    {"rows", "settings"},  # settings names the codecs rows defines; rows reads its line limit
    {"jobdir"},
    {"shards", "coordination", "stats", "batching", "quarantine", "dedup"},
    {"status"},
    {"report", "console"},
    {"execution"},
    {"integration", "preparation", "finalize", "job_run", "local_worker", "executor", "cli", "cli_options", "__init__"},
]
# Packages that must never import Ray, Data-Juicer or torch, not even inside a function.
ENGINE_FREE = {"sharedfs", "rows", "jobdir", "shards", "coordination", "status", "stats", "report", "console", "dedup"}
ENGINES = ("ray", "data_juicer", "torch")
# Every package below ``execution`` (these and compat, batching, quarantine, settings, errors) imports
# no engine when it is imported: compat reaches engines, and batching and quarantine run inside
# Data-Juicer's operators, only inside the functions that need them.
BELOW_EXECUTION = set().union(*LAYERS[: next(i for i, layer in enumerate(LAYERS) if "execution" in layer)])


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def unit(path: Path) -> str:
    """The package (or top-level module) a file belongs to."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def layer_of(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise AssertionError(f"{name} is in no layer: add it to LAYERS and to docs/architecture.md")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, including those inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_every_package_and_module_has_a_layer():
    for path in modules():
        layer_of(unit(path))


def test_packages_import_only_their_own_and_lower_layers():
    wrong = []
    for path in modules():
        here = unit(path)
        for line, module in imports(path):
            parts = module.split(".")
            if parts[0] != "data_juicer_elastic" or len(parts) == 1:
                continue
            target = parts[1]
            if target != here and layer_of(target) > layer_of(here):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {module}")
    assert not wrong, "imports that go up a layer:\n" + "\n".join(wrong)


def test_the_protocol_the_data_path_and_status_never_import_an_engine():
    wrong = []
    for path in modules():
        if unit(path) not in ENGINE_FREE:
            continue
        for line, module in imports(path):
            if module.split(".")[0] in ENGINES:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {module}")
    assert not wrong, "\n".join(wrong)


def module_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of the imports that run when the file is imported: every import
    outside a function body (class bodies and ``if``/``try`` blocks run), but ``if TYPE_CHECKING:``."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                visit(ast.Module(body=child.orelse, type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.lineno, child.module))
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def test_packages_below_execution_import_no_engine_when_imported():
    assert {"batching", "quarantine", "compat"} <= BELOW_EXECUTION and "execution" not in BELOW_EXECUTION
    wrong = []
    for path in modules():
        if unit(path) not in BELOW_EXECUTION:
            continue
        for line, module in module_level_imports(path):
            if module.split(".")[0] in ENGINES:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {module} at module level")
    assert not wrong, "\n".join(wrong)


def test_the_module_level_import_check_sees_what_runs_at_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import ray\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "try:\n    from data_juicer.ops import base_op\nexcept ImportError:\n    pass\n"
        "class C:\n    import ray.data\n"
        "def f():\n    import data_juicer\n"
    )
    assert module_level_imports(sample) == [(1, "ray"), (2, "typing"), (6, "data_juicer.ops"), (10, "ray.data")]


def test_module_names_are_unique_across_the_package():
    names = Counter(path.stem for path in modules() if path.stem != "__init__")
    assert [name for name, count in names.items() if count > 1] == []


# Verbs a module offers as its protocol, always called qualified (``patches.install()``,
# ``ray_concat.check_ray_concat()``): the same verb in several modules is the point.
MODULE_VERBS = {"install", "installed", "enabled", "self_check"}


def test_public_function_and_class_names_are_unique_across_the_package():
    where: dict[str, list[str]] = {}
    for path in modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if node.name in MODULE_VERBS and isinstance(node, ast.FunctionDef):
                    continue
                where.setdefault(node.name, []).append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    duplicated = {name: places for name, places in where.items() if len(places) > 1}
    assert duplicated == {}


def test_exceptions_are_defined_only_in_errors_py():
    wrong = []
    for path in modules():
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base).split(".")[-1] for base in node.bases}
                if any(base.endswith(("Error", "Exception", "Interrupt")) for base in bases):
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: class {node.name}")
    assert not wrong, "\n".join(wrong)


# A dotted name of one of those packages with an underscore component that is not a dunder
# (``ray._private.worker``, ``ray.data._internal...``; ``data_juicer.__version__`` is public).
PRIVATE = re.compile(r"\b(?:ray|data_juicer|ddsketch|jsonargparse)(?:\.\w+)*?\._(?!_)\w*")


def test_private_internals_of_ray_and_data_juicer_are_reached_only_from_compat():
    wrong = []
    for path in modules():
        if unit(path) == "compat":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if PRIVATE.search(code):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_modules_stay_small(path):
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


def test_every_package_declares_its_public_surface():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        tree = ast.parse(init.read_text())
        names = [
            target.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        ]
        assert "__all__" in names, f"{init.relative_to(PACKAGE.parent)} has no __all__"


def test_a_package_that_re_exports_nothing_lists_every_module_in_all():
    """docs/architecture.md describes the modules; a package's docstring says what the package is for."""
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        tree = ast.parse(init.read_text())
        body = [node for node in tree.body if not isinstance(node, ast.Expr)]
        if len(body) != 1:  # the package defines or re-exports names: its __all__ lists those
            continue
        declared = ast.literal_eval(body[0].value)
        modules = sorted(
            p.stem for p in init.parent.glob("*.py") if p.stem != "__init__" and not p.stem.startswith("_")
        )
        assert declared == modules, f"{init.parent.name}: __all__ is not its module list"


# --- The package's own import graph: no cycle, and function-local imports only where an engine must wait ---
#
# A cycle is counted through every import that runs, at module level or inside a function: a
# function-local import that closes a cycle hides it (the two modules still need each other), it
# does not remove it.  ``if TYPE_CHECKING:`` imports never run and are not edges.
MAX_LOCAL_IMPORTS = 20
# Where a module may wait to import one of the package's own: the one module that loads an engine
# (computed: ``heavy_modules``), or, in ``cli`` alone, the module a subcommand runs (a `dj-elastic`
# process does one thing, and loading the whole package triples the start-up of ``--version``).
# Every such import, with why it waits:
_SUBCOMMAND = "the work of one dj-elastic subcommand, loaded when that subcommand runs"
DEFERRED_IMPORTS = {
    ("cli", "executor"): "`dj-elastic run` alone needs ElasticShardedExecutor, a subclass of Data-Juicer's "
    "ExecutorBase: --version, status, merge and the other subcommands never load Data-Juicer",
    ("integration.dispatch", "executor"): "the patches are installed whenever Data-Juicer loads its plugins; "
    "the executor (Data-Juicer's ExecutorBase) is loaded only when an elastic recipe runs",
    ("cli", "preparation"): _SUBCOMMAND + " (prepare)",
    ("cli", "local_worker"): _SUBCOMMAND + " (worker)",
    ("cli", "console.summary"): _SUBCOMMAND + " (worker: the closing line)",
    ("cli", "status.job_view"): _SUBCOMMAND + " (status)",
    ("cli", "report.render"): _SUBCOMMAND + " (report)",
    ("cli", "integration.dispatch"): _SUBCOMMAND + " (run: the closing summary)",
    ("cli", "integration.retry_command"): _SUBCOMMAND + " (retry)",
    ("cli", "finalize"): _SUBCOMMAND + " (merge)",
    ("cli", "jobdir.manifest"): _SUBCOMMAND + " (worker and merge read the job's plan)",
    ("cli", "shards.verify"): _SUBCOMMAND + " (verify)",
    ("cli", "shards.clean"): _SUBCOMMAND + " (clean)",
    ("cli", "integration.doctor"): _SUBCOMMAND + " (doctor)",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PACKAGE_MODULES = {module_name(path): path for path in modules()}


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads: ``from pkg import sub`` loads ``pkg.sub`` (and ``pkg``,
    its parent, which any import of ``pkg.sub`` runs anyway: not an edge of its own)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.module or node.level:
        return []
    subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in PACKAGE_MODULES]
    return subs + ([node.module] if len(subs) < len(node.names) else [])


def split_imports(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(module-level, function-local) imports of a file as (line, module); TYPE_CHECKING ones left out."""
    top: list[tuple[int, str]] = []
    local: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                visit(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (local if in_function else top).extend((child.lineno, t) for t in _targets(child))
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return top, local


def own(module: str) -> bool:
    return module in PACKAGE_MODULES


def heavy_modules() -> set[str]:
    """Package modules that load Data-Juicer, Ray or torch when imported: directly at module level,
    or through a module-level import of a heavy package module (or of its parent packages)."""
    top = {name: [m for _, m in split_imports(path)[0]] for name, path in PACKAGE_MODULES.items()}
    heavy = {name for name, found in top.items() if any(m.split(".")[0] in ENGINES for m in found)}
    while True:
        loads = {
            name
            for name, found in top.items()
            for m in found
            if any(".".join(m.split(".")[:i]) in heavy for i in range(1, m.count(".") + 2))
        }
        if loads <= heavy:
            return heavy
        heavy |= loads


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return cycles


def short(module: str) -> str:
    return module.removeprefix("data_juicer_elastic.") or module


def runs_when_imported(module: str) -> list[str]:
    """``a.b.c`` runs ``a``, ``a.b`` (their ``__init__``) and ``a.b.c``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_edges() -> dict[str, set[str]]:
    """Module -> the package modules its imports run: the imported module and the packages above it,
    but its own packages (Python has started those before the module itself)."""
    edges: dict[str, set[str]] = {}
    for name, path in PACKAGE_MODULES.items():
        top, local = split_imports(path)
        own_packages = set(runs_when_imported(name))
        edges[name] = {
            each for _, m in top + local for each in runs_when_imported(m) if own(each) and each not in own_packages
        }
    return edges


def test_the_package_has_no_import_cycle():
    """A Ray worker that unpickles an operator imports its module first, whichever it is: any loop,
    through a package's ``__init__`` too, can meet a half-initialised module there."""
    cycles = import_cycles(import_edges())
    assert not cycles, "modules that import each other (move the shared piece down):\n" + "\n".join(
        " <-> ".join(map(short, cycle)) for cycle in cycles
    )


def loaded_at_import(name: str) -> set[str]:
    """The package modules importing ``name`` loads (itself, its module-level imports, theirs, and
    the packages above each)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for each in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if each in PACKAGE_MODULES and each not in seen:
                seen.add(each)
                todo += [m for _, m in split_imports(PACKAGE_MODULES[each])[0] if own(m)]
    return seen


def test_function_local_imports_of_the_package_only_defer_an_engine_or_a_subcommand():
    heavy = heavy_modules()
    cli_loads = loaded_at_import("data_juicer_elastic.cli")
    found: list[str] = []
    wrong: list[str] = []
    pairs: set[tuple[str, str]] = set()
    for name, path in PACKAGE_MODULES.items():
        for line, module in split_imports(path)[1]:
            if not module.startswith("data_juicer_elastic"):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{line}: {short(module)}"
            found.append(where)
            pairs.add((short(name), short(module)))
            subcommand = name == "data_juicer_elastic.cli" and module not in cli_loads
            if module not in heavy and not subcommand:
                wrong.append(where)
    assert not wrong, "light modules imported inside a function (import them at module level):\n" + "\n".join(wrong)
    assert len(found) <= MAX_LOCAL_IMPORTS, "\n".join(found)
    assert pairs == set(DEFERRED_IMPORTS), "each deferred import is listed in DEFERRED_IMPORTS with its reason"
    assert not cli_loads & heavy, "dj-elastic --version loads no engine"


def test_the_import_graph_checks_see_cycles_and_heavy_modules(tmp_path):
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\nimport os\n"
        "if TYPE_CHECKING:\n    import data_juicer_elastic.executor\n"
        "def f():\n    from data_juicer_elastic import executor\n    class C:\n        import json\n"
    )
    top, local = split_imports(sample)
    assert top == [(1, "typing"), (2, "os")]
    assert local == [(6, "data_juicer_elastic.executor"), (8, "json")]
    assert "data_juicer_elastic.executor" in heavy_modules()


def test_the_protocol_is_a_handful_of_modules():
    """jobdir/ holds one module per concept of the protocol (one task queue, one records module...):
    at most 14 files with its ``__init__``, so a newcomer can hold it."""
    assert len(list((PACKAGE / "jobdir").glob("*.py"))) <= 14
