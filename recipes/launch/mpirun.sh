#!/usr/bin/env bash
# mpirun (e.g. a PAI-DLC MPIJob, whose command runs once on the Launcher):
# prepare once, one worker per node, then merge and check.
#   bash mpirun.sh 4          # 4 worker nodes
# No elections are needed: the Launcher alone prepares and merges.  Workers need no MPI
# library; mpirun is only the process starter.  Without mpirun (to try it on one
# machine) the workers are started as local background processes instead.
set -euo pipefail
NODES=${1:-4}
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
JOB_ROOT=${JOB_ROOT:-/mnt/shared/dj-jobs/job-001}
cd "$CODE"
dj-elastic prepare --config recipes/launch/multinode.yaml --job-dir "$JOB_ROOT/job" --num-shards $((NODES * 4))
if command -v mpirun >/dev/null; then
  mpirun -np "$NODES" -npernode 1 dj-elastic worker --job-dir "$JOB_ROOT/job"
else
  pids=()
  for i in $(seq 1 "$NODES"); do
    DJ_ELASTIC_NODE_ID="local-$i" dj-elastic worker --job-dir "$JOB_ROOT/job" --ray-num-cpus 1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
fi
dj-elastic merge --job-dir "$JOB_ROOT/job" --output "$JOB_ROOT/merged.jsonl"
dj-elastic verify --job-dir "$JOB_ROOT/job" --expect-nodes 1
dj-elastic status --job-dir "$JOB_ROOT/job"
