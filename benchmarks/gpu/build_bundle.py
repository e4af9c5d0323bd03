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
  maps (neither is used by a Python job), xz-compressed: ~79 MB -> ~30 MB;
* ``install.sh``: installs into ``$SITE`` (default ``/tmp/dje-site``) every
  bundled distribution the far side does not already have (so its own torch,
  pyarrow, ... stay), unpacks Ray, and checks that everything imports.

``--profile cuda-image`` (the default) leaves out what the lent GPU machine's
image already has (its package list: pyarrow, pandas, aiohttp, ...;
:data:`CUDA_IMAGE`); ``--profile bare`` bundles those too and may not fit in
64 MiB: the script says so.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
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
    # Data-Juicer 1.6.1 at import
    "loguru", "pillow", "tomli", "zstandard", "datasets", "multiprocess", "dill", "xxhash", "aiohttp", "multidict",
    "yarl", "propcache", "aiohappyeyeballs", "aiosignal", "frozenlist", "jsonargparse", "beautifulsoup4",
    "tabulate", "emoji", "wget",
    # data-juicer-elastic
    "orjson", "jiter", "pysimdjson", "ddsketch",
)  # fmt: skip
# Present in the lent GPU machine's image ('cuda', package list as read on 2026-11-17).
CUDA_IMAGE = frozenset(
    "aiohappyeyeballs aiohttp aiosignal attrs frozenlist multidict pandas pillow propcache protobuf pyarrow "
    "python-dateutil requests six urllib3 yarl msgpack tabulate".split()
)


def pip(*args: str, cwd: Path | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, cwd=cwd, stdout=subprocess.DEVNULL)


def pinned(name: str) -> str:
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def fetch(name: str, wheels: Path) -> None:
    """The tested version's cp312 wheel; else the newest cp312 wheel (the tested version has none: orjson);
    else, for sdist-only pure-Python packages (emoji, wget), a wheel built here (refused if not pure)."""
    for spec in dict.fromkeys((pinned(name), name)):
        try:
            pip("download", "--no-deps", *PLATFORM, "-d", str(wheels), spec)
            return
        except subprocess.CalledProcessError:
            continue
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
            z.extractall(tmp)
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
missing=()
for whl in "$HERE"/wheels/*.whl; do
    dist="$(basename "$whl" | cut -d- -f1)"
    if ! "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null; then
        missing+=("$whl")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${missing[@]}"
fi
if ! "$PY" -c "import ray" 2>/dev/null; then
    tar -xJf "$HERE"/ray-*.tar.xz -C "$SITE"
fi
echo "installed ${#missing[@]} wheel(s) and Ray into $SITE; use: export PYTHONPATH=$SITE"
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "
import ray, ray.data, data_juicer, data_juicer.ops, data_juicer_elastic.cli, tokenizers, transformers, torch
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
    (args.out / "install.sh").write_text(INSTALL)
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
