"""Build the bundle that lets ``bench.py`` run on a GPU machine without network, Ray or Data-Juicer.

    python benchmarks/gpu/build_bundle.py                      # -> .gpu-bundle/ (git-ignored)
    python benchmarks/gpu/build_bundle.py --profile bare       # for a machine with only torch/transformers/numpy

The far side: Python 3.12 on x86-64 Linux with torch (CUDA), transformers and
numpy, no network, and at most 64 MiB of files per run (the repository
included).  The bundle holds:

* ``wheels/``: cp312 manylinux x86_64 (or pure-Python) wheels, ``--no-deps``, of
  py-data-juicer, this project, and what they import at run time beyond the far
  side's packages (:data:`NEEDED`, found by importing Data-Juicer, Ray Data and
  this project in a Python 3.12 environment that held only torch, transformers
  and numpy, adding what was missing until nothing was).  Versions are the ones
  installed where the bundle is built (the ones the tests ran with); sdist-only
  pure-Python packages (emoji, wget) are built into wheels here;
* ``ray-<version>.tar.xz``: Ray's wheel contents without its Java jars and source
  maps (neither is used by a Python job), file modes kept, xz-compressed:
  ~76 MiB -> ~23 MiB (Ray 2.60.0);
* ``install.sh``: stops, naming them, if the machine lacks a package the profile
  left out; installs into ``$SITE`` (default ``/tmp/dje-site``) every bundled
  distribution the far side does not already have (so its own torch, pyarrow,
  ... stay), unpacks Ray, and checks that everything imports.

``run_on_gpu.sh`` is the one command for the GPU machine (install + bench.py,
results in ``$OUT``); ``dry_run_bundle.sh`` runs it here with ``--cpu-dry-run``,
offline, in a Python 3.12 venv holding only the GPU image's packages.

``--profile cuda-image`` (the default) leaves out what the lent GPU machine's
image already has (its package list: pyarrow, pandas, aiohttp, ...;
:data:`CUDA_IMAGE`); ``--profile bare`` bundles those too and may not fit in
64 MiB: the script says so.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT_MIB = 64
PLATFORM = [
    "--only-binary=:all:",
    "--python-version=3.12",
    "--implementation=cp",
    "--abi=cp312",
    *(
        f"--platform={p}"
        for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64")
    ),
]
# What Data-Juicer 1.6.1, Ray Data and data-juicer-elastic import at run time, beyond torch/transformers/numpy
# (and what those pull in: tqdm, pyyaml, regex, packaging, filelock, fsspec, huggingface-hub, safetensors, ...).
NEEDED = (
    # Ray core and Ray Data
    "msgpack", "protobuf", "requests", "urllib3", "jsonschema", "attrs", "referencing", "rpds-py",
    "jsonschema-specifications", "pyarrow", "pandas", "python-dateutil", "six",
    # Data-Juicer 1.6.1 at import (psutil: `import data_juicer` needs it before Ray, whose vendored copy in
    # ray/thirdparty_files only joins sys.path once `import ray` ran, which hid it from the first list)
    "psutil", "loguru", "pillow", "tomli", "zstandard", "datasets", "multiprocess", "dill", "xxhash", "aiohttp",
    "multidict", "yarl", "propcache", "aiohappyeyeballs", "aiosignal", "frozenlist", "jsonargparse", "beautifulsoup4",
    "tabulate", "emoji", "wget",
    # data-juicer-elastic
    "orjson", "jiter", "pysimdjson", "ddsketch",
)  # fmt: skip
# Present in the lent GPU machine's image ('cuda', package list as read on 2026-11-17).
CUDA_IMAGE = frozenset(
    "aiohappyeyeballs aiohttp aiosignal attrs frozenlist multidict pandas pillow propcache protobuf pyarrow "
    "python-dateutil requests six urllib3 yarl msgpack tabulate psutil".split()
)


def pip(*args: str, cwd: Path | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, cwd=cwd, stdout=subprocess.DEVNULL)


def pinned(name: str) -> str:
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


# sdist-only at the tested version and pure Python: built into a wheel here (emoji 2.2.0 is Data-Juicer 1.6.1's pin)
BUILT_HERE = ("emoji", "wget")


def fetch(name: str, wheels: Path) -> None:
    """The tested version's cp312 wheel; else, for :data:`BUILT_HERE`, a wheel built here from the tested
    version's sdist (refused if not pure); else the newest cp312 wheel (the tested version has none: orjson).

    The pinned build comes before the newest wheel: the other way round emoji 2.16.0 was bundled instead of
    Data-Juicer's pinned 2.2.0.  Only the listed names are built, so no compiled package is built from source."""
    try:
        pip("download", "--no-deps", *PLATFORM, "-d", str(wheels), pinned(name))
        return
    except subprocess.CalledProcessError:
        if name not in BUILT_HERE:
            pip("download", "--no-deps", *PLATFORM, "-d", str(wheels), name)
            return
    with tempfile.TemporaryDirectory() as tmp:
        pip("wheel", "--no-deps", "--no-binary", ":all:", "-w", tmp, pinned(name))
        (built,) = Path(tmp).glob("*.whl")
        if not built.name.endswith("-none-any.whl"):
            raise SystemExit(f"{name}: no cp312 wheel and the sdist is not pure Python ({built.name})")
        shutil.move(built, wheels / built.name)


def slim_ray(wheels: Path, out: Path) -> Path:
    """Ray's wheel contents minus Java jars and source maps, as tar.xz (dist-info kept: Ray reads it)."""
    pip("download", "--no-deps", *PLATFORM, "-d", str(wheels), pinned("ray"))
    wheel = next(wheels.glob("ray-*.whl"))
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                # extractall() drops the unix mode: Ray's gcs_server and raylet would lose their exec bit
                # and `ray.init()` would fail with "Permission denied" (seen in the py3.12 dry run).
                mode = (info.external_attr >> 16) & 0o777
                extracted = z.extract(info, tmp)
                if mode:
                    os.chmod(extracted, mode)
        dropped = 0
        for path in Path(tmp).rglob("*"):
            if path.is_file() and (path.suffix in (".jar", ".map") or "/ray/jars/" in str(path)):
                dropped += path.stat().st_size
                path.unlink()
        target = out / f"{wheel.name.split('-cp')[0]}.tar.xz"
        with tarfile.open(target, "w:xz", preset=9) as tar:
            for entry in sorted(Path(tmp).iterdir()):
                tar.add(entry, arcname=entry.name)
    print(
        f"ray: {wheel.stat().st_size / 2**20:.1f} MiB wheel, dropped {dropped / 2**20:.1f} MiB "
        f"(jars, source maps) -> {target.stat().st_size / 2**20:.1f} MiB {target.name}"
    )
    wheel.unlink()
    return target


INSTALL = r"""#!/usr/bin/env bash
# Install the bundle beside this script into $SITE (default /tmp/dje-site), skipping what this Python has.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
SITE="${SITE:-/tmp/dje-site}"
mkdir -p "$SITE"
# Distributions of the names given that this Python lacks (one interpreter start, not one per wheel).
lacking() {
    "$PY" -c 'import importlib.metadata as m, os, sys
for arg in sys.argv[1:]:
    try:
        m.version(os.path.basename(arg).split("-")[0] if arg.endswith(".whl") else arg)
    except m.PackageNotFoundError:
        print(arg)' "$@"
}
# Left out of the bundle because the GPU machine's image has them (--profile cuda-image): say which are
# absent here, by name, instead of failing later on an import deep inside Data-Juicer or Ray.
absent=($(lacking @EXPECTED@))
if [ ${#absent[@]} -gt 0 ]; then
    echo "install.sh: this Python lacks ${absent[*]}, which the bundle expects the machine to have;" \
        "rebuild it with build_bundle.py --profile bare, or carry them as wheels" >&2
    exit 1
fi
mapfile -t missing < <(lacking "$HERE"/wheels/*.whl)
if [ ${#missing[@]} -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${missing[@]}"
fi
if ! PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import ray" 2>/dev/null; then
    tar -xJf "$HERE"/ray-*.tar.xz -C "$SITE"  # keeps the exec bits of gcs_server and raylet
fi
echo "installed ${#missing[@]} wheel(s) and Ray into $SITE; use: export PYTHONPATH=$SITE"
# Data-Juicer before Ray, as bench.py imports them: `import ray` puts ray/thirdparty_files (psutil, ...) on
# sys.path and would hide a dependency that Data-Juicer lacks.
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "
import data_juicer, data_juicer.ops, data_juicer_elastic.cli, tokenizers, transformers, torch, ray, ray.data
print('imports ok: ray', ray.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".gpu-bundle")
    parser.add_argument("--profile", choices=("cuda-image", "bare"), default="cuda-image")
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    wheels = args.out / "wheels"
    wheels.mkdir(parents=True)
    pip("wheel", "--no-deps", "-w", str(wheels), str(REPO))  # this project, from the working tree
    pip("download", "--no-deps", *PLATFORM, "-d", str(wheels), pinned("py-data-juicer"))
    skip = CUDA_IMAGE if args.profile == "cuda-image" else frozenset()
    for name in NEEDED:
        if name not in skip:
            fetch(name, wheels)
    slim_ray(wheels, args.out)
    expected = " ".join(sorted(skip)) if skip else ""  # what install.sh checks the machine has
    (args.out / "install.sh").write_text(INSTALL.replace("@EXPECTED@", expected))
    (args.out / "install.sh").chmod(0o755)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    repo = int(subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.count(0))
    tracked = sum(
        (REPO / f).stat().st_size
        for f in subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
        if (REPO / f).is_file()
    )
    print(
        f"{len(list(wheels.glob('*.whl')))} wheels; bundle {total / 2**20:.1f} MiB + repository "
        f"{tracked / 2**20:.1f} MiB ({repo} files) = {(total + tracked) / 2**20:.1f} MiB of {LIMIT_MIB} MiB"
    )
    if total + tracked > LIMIT_MIB * 2**20:
        print(
            f"too large for one run ({LIMIT_MIB} MiB): use --profile cuda-image or leave packages out", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
