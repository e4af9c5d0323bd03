#!/usr/bin/env bash
# Dry-run the GPU bundle here, as the GPU machine will run it, in one command:
#
#   bash benchmarks/gpu/dry_run_bundle.sh [--setup] [--rebuild] [--keep]
#
# 1. The simulated machine: a Python 3.12 venv ($SIM_VENV, default /tmp/py312-gpu-sim) with the GPU image's
#    torch 2.11.0 (PyPI's CUDA wheel and its nvidia-* libraries, ~3 GB: it imports and runs on CPU),
#    transformers 5.17.0, numpy 2.5.2, tokenizers, huggingface_hub and safetensors at the image's versions
#    (the lent GPU machine's package list, as build_bundle.py's CUDA_IMAGE records it), plus the image's packages the bundle leaves out (build_bundle.py's
#    CUDA_IMAGE: pyarrow, pandas, aiohttp, psutil, ...) and nothing else.  Made when missing or with --setup
#    (needs the network; from $PY312).
# 2. The bundle: .gpu-bundle/ from build_bundle.py, built when missing or with --rebuild (~7 min, mostly xz).
# 3. A fresh copy of what `run` carries (tracked and untracked-not-ignored files) plus .gpu-bundle, checked
#    against the 64 MiB limit.
# 4. In it, without network (`unshare -n`, loopback only, as Ray needs), a scrubbed environment (no pip
#    config or index, HF offline): `bash benchmarks/gpu/run_on_gpu.sh --cpu-dry-run`, the GPU command with
#    the dry-run flag (every contender, then the 2-shard elastic_sharded job through dj-process and Ray).
# Exit status: run_on_gpu.sh's (bench.py's: 1 when a row was lost, changed or reordered).  Logs stay in
# $STAGE/out; the staged copy, its site-packages and Ray's temp dir are removed unless --keep.
set -euo pipefail
REPO="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
SIM="${SIM_VENV:-/tmp/py312-gpu-sim}"
PY312="${PY312:-python3.12}"  # a Python 3.12 on PATH (the GPU machine's version), or set PY312
LIMIT=$((64 * 1024 * 1024))
setup=0 rebuild=0 keep=0
for arg in "$@"; do
    case "$arg" in
        --setup) setup=1 ;;
        --rebuild) rebuild=1 ;;
        --keep) keep=1 ;;
        *) echo "usage: $0 [--setup] [--rebuild] [--keep]" >&2; exit 2 ;;
    esac
done

if [ "$setup" = 1 ] || [ ! -x "$SIM/bin/python3" ]; then
    "$PY312" -m venv "$SIM"
    "$SIM/bin/pip" install -q torch==2.11.0 transformers==5.17.0 numpy==2.5.2 tokenizers==0.23.2 \
        huggingface_hub==1.33.0 safetensors==0.8.0
    image="$(cd "$REPO/benchmarks/gpu" && python3 -c 'import build_bundle as b; print(*sorted(b.CUDA_IMAGE))')"
    # shellcheck disable=SC2086  # one name per word
    "$SIM/bin/pip" install -q $image
fi
if [ "$rebuild" = 1 ] || [ ! -f "$REPO/.gpu-bundle/install.sh" ]; then
    python3 "$REPO/benchmarks/gpu/build_bundle.py"
fi

STAGE="$(mktemp -d /tmp/dje-gpu-dry.XXXXXX)"
mkdir -p "$STAGE/repo" "$STAGE/out"
(cd "$REPO" && git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf -) |
    tar -xf - -C "$STAGE/repo"
cp -a "$REPO/.gpu-bundle" "$STAGE/repo/"
bundle=$(du -sb "$STAGE/repo/.gpu-bundle" | cut -f1)
total=$(du -sb "$STAGE/repo" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "staged in $STAGE/repo: bundle $(mib "$bundle") + repository $(mib $((total - bundle))) = $(mib "$total")" \
    "of $(mib $LIMIT)"
if [ "$total" -gt "$LIMIT" ]; then
    echo "dry_run_bundle.sh: over the 64 MiB a run carries" >&2
    exit 1
fi

cd "$STAGE/repo"
set +e
# Ray's temp dir inside $STAGE: a Ray started here must not touch /tmp/ray, which other work may use.
unshare -n bash -c 'ip link set lo up && exec "$@"' _ env -i HOME="$HOME" PATH="$SIM/bin:/usr/bin:/bin" \
    LANG=C.UTF-8 PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    RAY_TMPDIR="$STAGE/ray" OUT="$STAGE/out" SITE="$STAGE/site" WORK="$STAGE/work" \
    bash benchmarks/gpu/run_on_gpu.sh --cpu-dry-run
rc=$?
set -e
if [ "$keep" = 0 ]; then
    rm -rf "$STAGE/repo" "$STAGE/site" "$STAGE/work" "$STAGE/ray"
fi
echo "dry_run_bundle.sh: exit $rc; logs in $STAGE/out"
exit $rc
