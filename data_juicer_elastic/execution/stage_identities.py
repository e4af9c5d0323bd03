"""Stage identities of a shard recipe, exactly as Data-Juicer's RayExecutor computes them: the ops
loaded, fused and identified as ``RayExecutor.run`` does, from a config parsed for ``executor_type:
ray`` (its Ray-mode attribute injection is what makes them a Ray run's).  No Ray starts.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from data_juicer_elastic.compat import dj_ops_internals
from data_juicer_elastic.compat.dj_ops_internals import no_ray_start
from data_juicer_elastic.errors import StageIdentityMismatch
from data_juicer_elastic.execution._dj_config import load_dj_config, ray_job_env


def compute_stage_identities(recipe: Mapping[str, Any]) -> list[str]:
    """The ordered stage ids (``stage-0000-occ0-1a2b3c4d:op_name``) of ``recipe``'s ops."""
    with tempfile.TemporaryDirectory(prefix="dj-elastic-identity-") as tmp:
        root = Path(tmp)
        (root / "input.jsonl").touch()  # a real path keeps Data-Juicer from warning about it
        overrides = {
            "dataset_path": str(root / "input.jsonl"),
            "export_path": str(root / "output.jsonl"),
            "export_type": "jsonl",
            "work_dir": str(root / "work"),
            "job_id": "stage-identities",
        }
        with ray_job_env(), no_ray_start():
            cfg = load_dj_config(recipe, overrides, root / "recipe.yaml", where="shard recipe")
            return stage_ids(manifest_from_cfg(cfg))


def manifest_from_cfg(cfg: Any) -> dict[str, Any]:
    """Data-Juicer's identity manifest (``stages`` ...), by the steps of ``RayExecutor.run`` that fix it."""
    # Looked up at each call: while a shard runs, warm_ops has swapped data_juicer.ops.load_ops.
    from data_juicer.ops import load_ops

    dj_ops_internals.check_identity_functions()  # a Data-Juicer without them: refused before any op is built
    # OPEnvManager (min_common_dep_num_to_combine) only sets runtime envs, which
    # are not part of an operator's fingerprint, so it is not built here.
    ops = load_ops(cfg.process)
    if cfg.get("op_fusion", False):
        ops = dj_ops_internals.fused(
            ops,
            mapper_fusion=cfg.get("mapper_fusion", True),
            mapper_fusion_vram_limit=cfg.get("mapper_fusion_vram_limit", 0.9),
        )
    return dj_ops_internals.identity_manifest(ops)


def stage_ids(manifest: Mapping[str, Any]) -> list[str]:
    return [stage["stage_id"] for stage in manifest["stages"]]


def verify_stage_identities(expected: Sequence[str], actual: Sequence[str], *, where: str) -> None:
    """Raise StageIdentityMismatch naming the first stage that differs."""
    expected, actual = list(expected), list(actual)
    if expected == actual:
        return
    for index in range(max(len(expected), len(actual))):
        want = expected[index] if index < len(expected) else "<no stage>"
        have = actual[index] if index < len(actual) else "<no stage>"
        if want != have:
            break
    raise StageIdentityMismatch(
        f"stage {index} differs: the job expects {want!r}, this worker computes {have!r} "
        f"({len(expected)} stages expected, {len(actual)} here); this worker's Data-Juicer or operator code "
        "differs from the one that prepared the job",
        where=where,
        hint="install the same py-data-juicer and operator code on every worker node "
        "(see the job manifest's versions), or prepare a new job",
    )


def write_identity_record(path: Path, manifest: Mapping[str, Any], expected: Sequence[str]) -> None:
    """Stamp the identities an attempt computed into ``attempt_dir/stage_identities.json``."""
    import data_juicer

    record = {
        "format": "dj-elastic/stage-identities",
        "version": 1,
        "data_juicer": getattr(data_juicer, "__version__", "unknown"),
        "stage_ids": stage_ids(manifest),
        "expected_stage_ids": list(expected),
        "manifest": dict(manifest),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
