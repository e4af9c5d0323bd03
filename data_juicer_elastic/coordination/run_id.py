"""Which run (submission) an instance belongs to: the same id on every instance without talking,
from the settings, the environment or the scheduler (the order: docs/multinode.md, "The run id").
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

RUN_ID_ENV: Final = "DJ_ELASTIC_RUN_ID"
SCHEDULER_ENVS: Final = ("PAI_JOB_ID", "DLC_JOB_ID", "JOB_ID")
SLURM_JOB: Final = "SLURM_JOB_ID"
SLURM_STEP: Final = "SLURM_STEP_ID"
# Kubernetes puts no job identity in the environment; the launch recipe mounts the
# pod's labels with the downward API, and the Job controller labels every pod with
# the Job's uid (unique per submission, unlike the Job's name).
K8S_LABELS_FILE: Final = Path("/etc/podinfo/labels")
_K8S_UID_LABELS: Final = ("batch.kubernetes.io/controller-uid", "controller-uid")
DERIVED: Final = "derived"
RUN_KEY_CHARS: Final = 24


@dataclass(frozen=True)
class RunId:
    value: str
    source: str  # the setting or variable it came from, or "derived"

    @property
    def key(self) -> str:
        return run_key(self.value)

    @property
    def shared(self) -> bool:
        """False for a derived id: no other instance can know it."""
        return self.source != DERIVED


def run_key(run_id: str) -> str:
    """Directory name of a run: a hash, so any run id (slashes, spaces) is a safe path component."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:RUN_KEY_CHARS]


def resolve_run_id(
    configured: str | None,
    environ: Mapping[str, str] | None = None,
    labels_file: Path = K8S_LABELS_FILE,
) -> RunId:
    env = os.environ if environ is None else environ
    if configured:
        return RunId(configured.strip(), "elastic.run_id")
    for name in (RUN_ID_ENV, *SCHEDULER_ENVS):
        value = env.get(name, "").strip()
        if value:
            return RunId(value if name == RUN_ID_ENV else f"{name}={value}", name)
    slurm = env.get(SLURM_JOB, "").strip()
    if slurm:
        step = env.get(SLURM_STEP, "").strip()
        return RunId(f"slurm-{slurm}" + (f".{step}" if step else ""), SLURM_JOB)
    k8s = kubernetes_job_uid(labels_file)
    if k8s:
        return RunId(f"k8s-job-{k8s}", str(labels_file))
    return RunId(f"{DERIVED}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(6)}", DERIVED)


_LABEL_LINE: Final = re.compile(r'^\s*([\w./\-]+)\s*=\s*"(.*)"\s*$')


def kubernetes_job_uid(labels_file: Path = K8S_LABELS_FILE) -> str | None:
    """The Job uid from a downward-API labels file (``key="value"`` lines), if mounted."""
    try:
        text = Path(labels_file).read_text(encoding="utf-8")
    except OSError:
        return None
    labels = dict(match.groups() for line in text.splitlines() if (match := _LABEL_LINE.match(line)))
    return next((labels[name] for name in _K8S_UID_LABELS if labels.get(name)), None)
