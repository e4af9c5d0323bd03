"""A recipe cut at its deduplicators, and the recipes each phase runs on a shard.

A recipe ``seg0, D1, seg1, D2, seg2`` has two *stages*: stage ``k`` is deduplicator ``Dk`` with the
operators before it.  The rows that reach ``Dk`` in a shard are a subsequence of the shard's input rows,
in order, and each carries its input row number (``rows.row_schema.ROW_COLUMN``) through Ray: a row's
global id is ``shard << 40 | input row`` (``dedup.keys``), which sorts in input order, so "the smallest
global row of each group" is the row Data-Juicer's default executor keeps.

The phase recipes replace deduplicators by two operators of this package (``execution.dedup_ops``):

- ``elastic_dedup_hash`` (last operator of a stage's signature recipe): the deduplicator's own
  ``compute_hash`` on every row, its hash column added;
- ``elastic_dedup_drop`` (in place of an earlier deduplicator): drops the rows that stage's drop list
  names (marked before the rows reach Ray, in the column :func:`drop_column`), and, where a later
  operator reads the hash column the deduplicator leaves in the rows, fills it as the deduplicator did.

Nothing here imports Data-Juicer: the recipe is plain data.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Final

HASH_OP: Final = "elastic_dedup_hash"
DROP_OP: Final = "elastic_dedup_drop"


@dataclass(frozen=True)
class Method:
    """How one deduplicator decides: ``exact`` keeps the first row of each hash; ``minhash`` the smallest
    row of each component of "shares a band"; ``simhash`` of "equal or within the Hamming distance"."""

    name: str
    hash_column: str
    # the column stays in the rows after the deduplicator (a later one of the same kind reuses it)
    column_stays: bool


EXACT: Final = Method("exact", "__dj__hash", True)
MINHASH: Final = Method("minhash", "__dj__minhash", False)  # its process removes the bytes column
SIMHASH: Final = Method("simhash", "__dj__simhash", True)

# operator name -> (the default operator whose semantics run, its method)
ACCEPTED: Final[dict[str, tuple[str, Method]]] = {
    "document_deduplicator": ("document_deduplicator", EXACT),
    "document_minhash_deduplicator": ("document_minhash_deduplicator", MINHASH),
    "document_simhash_deduplicator": ("document_simhash_deduplicator", SIMHASH),
    # Their Ray versions keep whichever copy arrives first; the first copy is one of those results.
    "ray_document_deduplicator": ("document_deduplicator", EXACT),
    "ray_bts_minhash_deduplicator": ("document_minhash_deduplicator", MINHASH),
}


def drop_column(number: int) -> str:
    """The column marking, on a shard's input rows, the rows stage ``number``'s drop list names."""
    return f"__dj_elastic_drop_{number}__"


@dataclass(frozen=True)
class DedupStage:
    number: int  # 1-based, in process order
    position: int  # its index in the recipe's process list (``process[position]``)
    op_name: str  # as the recipe names it
    runs_as: str  # the default operator whose semantics run (ACCEPTED)
    method: Method
    args: dict[str, Any]  # the arguments the default operator is built with

    @property
    def label(self) -> str:
        return f"process[{self.position}] {self.op_name}"

    def op_config(self) -> dict[str, Any]:
        """The default operator's entry of a process list."""
        return {self.runs_as: copy.deepcopy(self.args)}


def dedup_stages(process: list[dict[str, Any]], args_of=None) -> list[DedupStage]:
    """The deduplicators of ``process`` (one-key mappings, already checked) in order.  ``args_of(name,
    args)`` gives the default operator's arguments of an accepted operator (the recipe check drops a Ray
    version's own tuning keys); by default the arguments as written."""
    stages = []
    for position, entry in enumerate(process):
        ((name, args),) = entry.items()
        if name not in ACCEPTED:
            continue
        runs_as, method = ACCEPTED[name]
        args = dict(args or {})
        if args_of is not None:
            args = args_of(name, args)
        stages.append(DedupStage(len(stages) + 1, position, name, runs_as, method, args))
    return stages


def _keeps_hash(recipe: dict[str, Any], stages: list[DedupStage], stage: DedupStage) -> bool:
    """Whether the rows after ``stage`` must carry its hash column: the deduplicator leaves it there
    and a later deduplicator of the same column reuses it (``compute_hash`` returns early), or the
    export keeps hash columns."""
    if not stage.method.column_stays:
        return False
    later = any(s.method.hash_column == stage.method.hash_column for s in stages if s.number > stage.number)
    return later or bool(recipe.get("keep_hashes_in_res_ds"))


def _drop_entry(recipe: dict[str, Any], stages: list[DedupStage], stage: DedupStage) -> dict[str, Any]:
    return {
        DROP_OP: {
            "stage": stage.number,
            "dedup": stage.op_config(),
            "fill_hash": _keeps_hash(recipe, stages, stage),
        }
    }


def _with_process(recipe: dict[str, Any], process: list[dict[str, Any]]) -> dict[str, Any]:
    out = copy.deepcopy({k: v for k, v in recipe.items() if k != "process"})
    out["process"] = process
    return out


def signature_recipe(recipe: dict[str, Any], stages: list[DedupStage], number: int) -> dict[str, Any]:
    """The recipe of stage ``number``'s signature phase: the operators before its deduplicator (earlier
    deduplicators as drops), then ``elastic_dedup_hash`` of it."""
    stage = stages[number - 1]
    by_position = {s.position: s for s in stages}
    process = []
    for position, entry in enumerate(recipe["process"][: stage.position]):
        earlier = by_position.get(position)
        process.append(copy.deepcopy(entry) if earlier is None else _drop_entry(recipe, stages, earlier))
    process.append({HASH_OP: {"stage": stage.number, "dedup": stage.op_config()}})
    return _with_process(recipe, process)


def final_recipe(recipe: dict[str, Any], stages: list[DedupStage]) -> dict[str, Any]:
    """The recipe a shard's output is made with: every deduplicator a drop of its stage's list."""
    by_position = {s.position: s for s in stages}
    process = [
        copy.deepcopy(entry) if position not in by_position else _drop_entry(recipe, stages, by_position[position])
        for position, entry in enumerate(recipe["process"])
    ]
    return _with_process(recipe, process)


def stage_identity(recipe_hash: str, stage: DedupStage) -> str:
    """What every file of a stage's phases is written for: a file another recipe (or another stage) left
    is refused and recomputed (``dedup.tables``)."""
    return f"{recipe_hash}/dedup-{stage.number}-{stage.runs_as}"
