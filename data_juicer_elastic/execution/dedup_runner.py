"""What a shard run does for deduplication (docs/dedup.md), beside ``execution.shard_runner`` which runs
the phases: the recipe of each phase, the drop columns marked on the input rows, the stage identities a
phase recipe must have, and a signature run's rows and keys from its hash column.

A phase recipe is the job's recipe with its deduplicators replaced, one for one, by this package's
operators (``execution.dedup_ops``): every other operator keeps its place, its arguments and so its
stage identity, which is checked against the job's; the replacing operator must stand where the job has
a deduplicator (:func:`phase_stage_ids`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from data_juicer_elastic.dedup import keys as dedup_keys
from data_juicer_elastic.dedup import simhash_blocks
from data_juicer_elastic.dedup.stages import (
    ACCEPTED,
    DROP_OP,
    HASH_OP,
    DedupStage,
    drop_column,
    final_recipe,
    signature_recipe,
)
from data_juicer_elastic.errors import ElasticError, RecipeError
from data_juicer_elastic.execution.dedup_ops import dedup_args, deduplicator
from data_juicer_elastic.jobdir.attempts import SignatureOutput
from data_juicer_elastic.jobdir.exports import parse_line
from data_juicer_elastic.rows.row_schema import ROW_COLUMN

FINAL: Final = "final"
# Data-Juicer's document_simhash_deduplicator defaults (num_blocks, hamming_distance)
SIMHASH_DEFAULTS: Final = (6, 4)


def signature_phase(number: int) -> str:
    return f"signatures-{number}"


def phase_recipe(recipe: dict[str, Any], stages: list[DedupStage], phase: str) -> dict[str, Any]:
    """The recipe ``phase`` (:data:`FINAL` or :func:`signature_phase`) runs on a shard.  This package's
    operators get their deduplicator as JSON text: Data-Juicer's config parser turns nested mappings
    into namespaces and loses an empty one (``{document_deduplicator: {}}`` arrived as nothing)."""
    if phase == FINAL:
        found = final_recipe(recipe, stages) if stages else recipe
    else:
        number = next((s.number for s in stages if signature_phase(s.number) == phase), None)
        if number is None:
            raise ValueError(f"no phase {phase!r} in a recipe of {len(stages)} dedup stage(s)")
        found = signature_recipe(recipe, stages, number)
    for entry in found.get("process") or []:
        for name, args in entry.items():
            if name in (HASH_OP, DROP_OP) and isinstance(args.get("dedup"), dict):
                args["dedup"] = json.dumps(args["dedup"], sort_keys=True, separators=(",", ":"))
    return found


def marked_stages(stages: list[DedupStage], phase: str) -> list[int]:
    """The stages whose drop column ``phase``'s input rows carry: every stage's in the final phase, every
    earlier stage's in a signature phase."""
    if phase == FINAL:
        return [s.number for s in stages]
    number = next(s.number for s in stages if signature_phase(s.number) == phase)
    return [s.number for s in stages if s.number < number]


def with_drop_columns(tables: Sequence[Any], drops: Mapping[int, Any], numbers: Iterable[int], where: str) -> list[Any]:
    """``tables`` (Arrow, with :data:`ROW_COLUMN`) with one bool column per stage of ``numbers``: True on
    the rows ``drops[stage]`` (input row numbers) names.  A stage without a drop list is refused: a
    missing list would keep every duplicate."""
    import pyarrow as pa

    numbers = list(numbers)
    if not numbers:
        return list(tables)
    lists = {}
    for number in numbers:
        if number not in drops:
            raise ElasticError(
                f"no drop list for dedup stage {number}",
                where=where,
                hint="the shard runs only after every earlier dedup stage published its drop lists",
            )
        lists[number] = np.asarray(drops[number], dtype=np.int64)
    out = []
    for table in tables:
        rows = table.column(ROW_COLUMN).to_numpy(zero_copy_only=False).astype(np.int64)
        for number in numbers:
            marks = np.isin(rows, lists[number], assume_unique=False)
            table = table.append_column(drop_column(number), pa.array(marks, type=pa.bool_()))
        out.append(table)
    return out


def _op_name(stage_id: str) -> str:
    return stage_id.split(":", 1)[1] if ":" in stage_id else ""


def phase_stage_ids(expected: Sequence[str], actual: Sequence[str], phase: str) -> list[str]:
    """The stage ids a phase recipe must have, from the job's ``expected`` ones (its recipe with the
    deduplicators): the job's id at every position, but where this phase runs one of this package's
    operators and the job a deduplicator, the operator's own (its arguments are the deduplicator's).
    A signature phase is a prefix of the job's stages; the final phase is all of them."""
    ours = {HASH_OP, DROP_OP}
    derived = []
    for index, want in enumerate(expected):
        have = actual[index] if index < len(actual) else None
        if have is not None and _op_name(have) in ours and _op_name(want) in ACCEPTED:
            derived.append(have)
        else:
            derived.append(want)
    if phase != FINAL:
        hashed = next((i for i, have in enumerate(actual) if _op_name(have) == HASH_OP), len(actual) - 1)
        derived = derived[: hashed + 1]
    return derived


def _stage_op(stage: DedupStage) -> Any:
    """The stage's deduplicator, built as the phase operators build it (its parameters are read)."""
    return deduplicator(*dedup_args(stage.op_config(), {}))


def key_params(stage: DedupStage) -> dict[str, Any]:
    """The parameters the bucket phase needs of the deduplicator (read from Data-Juicer's instance)."""
    if stage.method.name == "simhash":
        op = _stage_op(stage)
        blocks = int(getattr(op, "num_blocks", SIMHASH_DEFAULTS[0]))
        distance = int(getattr(op, "hamming_distance", SIMHASH_DEFAULTS[1]))
        return {"num_blocks": blocks, "distance": distance}
    if stage.method.name == "minhash":
        op = _stage_op(stage)
        return {"num_bands": int(op.num_bands), "num_rows_per_band": int(op.num_rows_per_band)}
    return {}


def stage_keys(stage: DedupStage, hashes: list[Any], params: Mapping[str, Any]) -> np.ndarray:
    """``(rows, bands, 2)`` keys of the stage's hash column values (``dedup.keys``)."""
    method = stage.method.name
    if method == "exact":
        return dedup_keys.exact_keys(hashes)
    if method == "minhash":
        if not hashes:
            return np.empty((0, int(params["num_bands"]), 2), dtype=np.uint64)
        return dedup_keys.minhash_keys(hashes)
    values = dedup_keys.simhash_values(hashes)
    return simhash_blocks.simhash_keys(values, int(params["num_blocks"]), int(params["distance"]))


def collect_signatures(
    batches: Iterable[Any], stage: DedupStage, where: str, errors_path: Path | None
) -> SignatureOutput:
    """The rows reaching ``stage``'s deduplicator (their input row numbers, strictly increasing, else
    refused: an operator before it made rows) and their keys, from a signature run's Arrow batches."""
    column = stage.method.hash_column
    numbers: list[Any] = []
    hashes: list[Any] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if ROW_COLUMN not in batch.column_names or column not in batch.column_names:
            missing = ROW_COLUMN if ROW_COLUMN not in batch.column_names else column
            raise ElasticError(
                f"the rows reaching {stage.label} lack the column {missing!r}",
                where=where,
                hint="an operator before the deduplicator rebuilt the rows; run the deduplicator before it",
            )
        numbers += batch.column(ROW_COLUMN).to_pylist()
        hashes += batch.column(column).to_pylist()
    if any(n is None for n in numbers) or any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
        raise RecipeError(
            f"an operator before {stage.label} emitted more rows than it got (or reordered them): "
            "a deduplicator across shards needs each row it sees to be one input row, in input order",
            where=where,
            hint="move the row-splitting or row-making operator after the deduplicator, or remove it",
        )
    if any(h is None for h in hashes):
        raise ElasticError(f"{stage.label}: a row reached the signature without a hash", where=where)
    params = key_params(stage)
    found = stage_keys(stage, hashes, params)
    if stage.method.name == "minhash" and found.shape[1] != params["num_bands"]:
        raise ElasticError(
            f"{stage.label}: the rows carry {found.shape[1]} MinHash bands, the operator makes {params['num_bands']}",
            where=where,
            hint="an operator before the deduplicator wrote __dj__minhash; remove it from the rows",
        )
    return SignatureOutput(
        rows=np.asarray(numbers, dtype=np.uint64),
        keys=found,
        method=stage.method.name,
        params=params,
        failed=hash_failures(errors_path),
        errors_path=errors_path,
    )


def hash_failures(errors_path: Path | None) -> np.ndarray:
    """The input row numbers (within the shard) whose ``compute_hash`` raised, from an attempt's
    ``errors.jsonl`` (quarantined, so left out of the output: the stage's drop list names them too)."""
    if errors_path is None:
        return np.empty(0, dtype=np.uint64)
    found = []
    with open(errors_path, "rb") as handle:
        for line in handle:
            record, _ = parse_line(line)
            if record.op == HASH_OP and record.shard_row is not None:
                found.append(record.shard_row)
    return np.asarray(sorted(found), dtype=np.uint64)
