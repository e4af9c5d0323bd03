#!/usr/bin/env bash
# PAI-DLC worker broadcast: paste the last command as the job's ONE startup command.
#
# Job type: a PyTorch-style job that runs the startup command on every Worker (not
# DLC's Ray framework, which builds one cross-node Ray cluster; not MPIJob, whose
# command runs only on the Launcher: use mpirun.sh there).  Worker count: any N.
# Mount the code and a read-write NAS/CPFS at the same paths on every Worker.
#
# Every Worker runs the same command.  They share one run id (DLC's job id, seen as
# PAI_JOB_ID or DLC_JOB_ID; if your image has neither, export DJ_ELASTIC_RUN_ID with
# a value unique per submission), elect one preparer and one finalizer through the
# job directory, and all exit 0 - or all exit 2 with the same message.
# To try it on one machine: JOB_ROOT=/tmp/dlc-try PAI_JOB_ID=try-1 bash pai_dlc_broadcast.sh
set -euo pipefail
CODE=${CODE:-/mnt/data/data-juicer-elastic}     # this repository, on every Worker
JOB_ROOT=${JOB_ROOT:-/mnt/shared/dj-jobs/job-001}
[ -d "$CODE" ] || CODE=$(cd "$(dirname "$0")/../.." && pwd)
cd "$CODE"
exec dj-process --config recipes/launch/multinode.yaml \
  --elastic.job_dir "$JOB_ROOT/job" \
  --export_path "$JOB_ROOT/merged.jsonl" \
  --elastic.num_shards 16 \
  ${WORLD_SIZE:+--elastic.nodes "$WORLD_SIZE"}
