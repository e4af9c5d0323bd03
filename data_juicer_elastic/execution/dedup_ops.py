"""The two operators the deduplication phase recipes run in place of a deduplicator (``dedup.stages``),
registered with Data-Juicer's ``OPERATORS`` by :func:`register_dedup_ops` (the plugin's operator patch calls it
in every process that loads Data-Juicer's operators, Ray workers included), so importing this module
loads no engine.  Design: docs/dedup.md, "The operators".

- ``elastic_dedup_hash(stage, dedup)``: the deduplicator's own ``compute_hash`` on every row (its hash
  column added); the last operator of a stage's signature recipe.
- ``elastic_dedup_drop(stage, dedup, fill_hash)``: drops the rows whose ``stages.drop_column(stage)`` is
  True and removes that column; with ``fill_hash`` it then fills the hash column of the rows it keeps
  with ``compute_hash``, as the deduplicator leaves it for a later one (or the export keeps it).

``dedup`` is ``{name: args}``: the default deduplicator (Data-Juicer's own class from ``OPERATORS``),
built once per process and configuration, with the arguments Data-Juicer's config parser gives every
operator (``text_key`` ...) taken from this operator's own when ``args`` does not set them.  A row whose
hashing raises is an operator error like any other (docs/quarantine.md).
"""

from __future__ import annotations

import json
import threading
from typing import Any, Final

from data_juicer_elastic.dedup.stages import ACCEPTED, DROP_OP, HASH_OP, drop_column

HASH_CLASS: Final = "ElasticDedupHash"
DROP_CLASS: Final = "ElasticDedupDrop"
# What Data-Juicer's config parser puts into every operator's arguments (``update_op_attr``), so the
# deduplicator built here gets what the default executor's would; ``work_dir`` is left out (per
# attempt, and no deduplicator hashes with it).
INHERITED: Final = (
    "text_key",
    "image_key",
    "audio_key",
    "video_key",
    "image_bytes_key",
    "turbo",
    "skip_op_error",
    "auto_op_parallelism",
)
_LOCK = threading.Lock()
_BUILT: dict[str, Any] = {}  # configuration -> deduplicator, per process


def register_dedup_ops() -> tuple[type, type]:
    """The two operator classes, defined and registered with Data-Juicer's ``OPERATORS`` on the first call."""
    from data_juicer.ops import base_op

    with _LOCK:
        if HASH_CLASS not in globals():
            hash_class, drop_class = _define(base_op.OPERATORS, base_op.Mapper)
            globals()[HASH_CLASS], globals()[DROP_CLASS] = hash_class, drop_class
        return globals()[HASH_CLASS], globals()[DROP_CLASS]


def __getattr__(name: str) -> Any:
    """The classes by attribute or by pickle (a Ray worker unpickling an operator) are :func:`register_dedup_ops`'s."""
    if name in (HASH_CLASS, DROP_CLASS, "_DedupOp"):
        register_dedup_ops()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dedup_args(dedup: Any, inherited: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of the default deduplicator ``dedup`` (``{name: args}``, or that mapping as
    JSON text) names, with the
    parser's per-operator arguments from ``inherited`` where ``args`` leaves them unset."""
    if isinstance(dedup, str):  # as phase recipes carry it (dedup_runner.phase_recipe)
        dedup = json.loads(dedup)
    if not isinstance(dedup, dict) or len(dedup) != 1:
        raise ValueError(f"dedup must be one {{name: args}} mapping, not {dedup!r}")
    ((name, args),) = dedup.items()
    if name not in {runs_as for runs_as, _ in ACCEPTED.values()}:
        raise ValueError(f"dedup names {name!r}, not one of the default deduplicators this package runs")
    merged = {key: value for key, value in inherited.items() if key in INHERITED and value is not None}
    merged.update({key: value for key, value in dict(args or {}).items() if value is not None})
    return name, merged


def deduplicator(name: str, args: dict[str, Any]) -> Any:
    """Data-Juicer's own operator ``name`` built with ``args``, once per process and configuration."""
    from data_juicer.ops.base_op import OPERATORS

    key = json.dumps([name, args], sort_keys=True, default=repr)
    with _LOCK:
        found = _BUILT.get(key)
    if found is None:
        found = OPERATORS.modules[name](**args)
        with _LOCK:
            found = _BUILT.setdefault(key, found)
    return found


def _define(OPERATORS: Any, Mapper: type) -> tuple[type, type]:  # noqa: N803 (Data-Juicer's names)
    class _DedupOp(Mapper):
        _batched_op = True

        def _setup(self, stage: int, dedup: Any, kwargs: dict[str, Any]) -> None:
            self.stage = int(stage)
            self.dedup_config = dedup
            self._dedup_name, self._dedup_args = dedup_args(dedup, kwargs)
            self._dedup: Any = deduplicator(self._dedup_name, self._dedup_args)  # bad arguments: refused here

        @property
        def dedup(self) -> Any:
            if self._dedup is None:  # unpickled in a Ray worker: this process's own
                self._dedup = deduplicator(self._dedup_name, self._dedup_args)
            return self._dedup

        def __getstate__(self) -> dict[str, Any]:
            state = dict(self.__dict__)
            state["_dedup"] = None
            return state

        def _hashed(self, samples: dict[str, list], rows: list[int]) -> dict[str, list]:
            """``samples`` with the deduplicator's ``compute_hash`` applied to each row of ``rows``
            (new columns for those rows only: ``rows`` must be every row)."""
            out = {key: list(values) for key, values in samples.items()}
            count = len(next(iter(samples.values()), []))
            for position in rows:
                row = self.dedup.compute_hash({key: values[position] for key, values in samples.items()})
                for key, value in row.items():
                    if key not in out:
                        out[key] = [None] * count
                    out[key][position] = value
            return out

    class ElasticDedupHash(_DedupOp):
        """The deduplicator's own ``compute_hash`` on every row: its hash column added."""

        def __init__(self, stage: int = 1, dedup: str | dict | None = None, *args, **kwargs):
            """
            :param stage: the dedup stage number (1-based, in process order)
            :param dedup: the default deduplicator, ``{name: args}`` or its JSON text
            """
            super().__init__(*args, **kwargs)
            self._setup(stage, dedup, kwargs)

        def process_batched(self, samples, *args, **kwargs):
            count = len(next(iter(samples.values()), []))
            return self._hashed(samples, list(range(count)))

    class ElasticDedupDrop(_DedupOp):
        """Drops the rows the stage's drop list names (marked in its drop column, which it removes);
        ``fill_hash``: the kept rows get the deduplicator's hash column, as the deduplicator leaves it."""

        def __init__(self, stage: int = 1, dedup: str | dict | None = None, fill_hash: bool = False, *args, **kwargs):
            """
            :param stage: the dedup stage number (1-based, in process order)
            :param dedup: the default deduplicator, ``{name: args}`` or its JSON text
            :param fill_hash: fill the hash column of the kept rows with the deduplicator's ``compute_hash``
            """
            super().__init__(*args, **kwargs)
            self._setup(stage, dedup, kwargs)
            self.fill_hash = bool(fill_hash)

        def process_batched(self, samples, *args, **kwargs):
            column = drop_column(self.stage)
            count = len(next(iter(samples.values()), []))
            if column not in samples:
                if count == 0:
                    return samples
                raise ValueError(
                    f"the rows reach {DROP_OP} of dedup stage {self.stage} without its column {column!r}: "
                    "an operator before it rebuilt the rows without the columns it did not know"
                )
            marks = samples[column]
            keep = [i for i in range(count) if not marks[i]]
            out = {key: [values[i] for i in keep] for key, values in samples.items() if key != column}
            if self.fill_hash and keep:
                out = self._hashed(out, list(range(len(keep))))
            return out

    # Named as if defined at module level: the classes and their methods pickle by reference.
    for cls, name in ((_DedupOp, "_DedupOp"), (ElasticDedupHash, HASH_CLASS), (ElasticDedupDrop, DROP_CLASS)):
        cls.__qualname__ = name
        for attr, value in vars(cls).items():
            if callable(value) and hasattr(value, "__qualname__"):
                value.__qualname__ = f"{name}.{attr}"
    globals()["_DedupOp"] = _DedupOp
    OPERATORS.register_module(HASH_OP, ElasticDedupHash)
    OPERATORS.register_module(DROP_OP, ElasticDedupDrop)
    return ElasticDedupHash, ElasticDedupDrop
