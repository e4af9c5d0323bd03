#!/usr/bin/env bash
# The one command for the GPU machine: install the bundle, then run bench.py.
#
#   bash benchmarks/gpu/run_on_gpu.sh                  # on the GPU machine, repository root, .gpu-bundle carried
#   bash benchmarks/gpu/run_on_gpu.sh --cpu-dry-run    # what dry_run_bundle.sh runs here, offline, on py3.12
#
# Extra arguments go to bench.py after `--sharded --json $OUT/gpu.json` (a later --json/--workdir wins).
# Everything worth reading lands flat in $OUT (the device tool returns at most 8 files, 2 folders deep):
# install.log, gpu.log, gpu.json, dj-process.log (the sharded job's log) and nvidia-smi.txt.
set -uo pipefail
OUT="${OUT:-/tmp/dje-gpu-out}"
export SITE="${SITE:-/tmp/dje-site}"
WORK="${WORK:-/tmp/dje-gpu-bench}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
{ nvidia-smi 2>&1 || echo "no nvidia-smi"; python3 --version; } >"$OUT/nvidia-smi.txt"
bash .gpu-bundle/install.sh 2>&1 | tee "$OUT/install.log" || exit 3
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 python3 benchmarks/gpu/bench.py \
    --sharded --workdir "$WORK" --json "$OUT/gpu.json" "$@" 2>&1 | tee "$OUT/gpu.log"
rc=$?
cp "$WORK/sharded/dj-process.log" "$OUT/" 2>/dev/null || true
echo "run_on_gpu.sh: bench.py exit $rc; results in $OUT"
exit $rc
