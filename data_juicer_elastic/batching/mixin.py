"""``AdaptiveBatchingMixin``: lossless OOM-adaptive micro-batching for a batched Data-Juicer Mapper
(docs/adaptive-batching.md).  It replaces ``self.process`` (``process_batched`` under Data-Juicer's
``skip_op_error`` handler) with the micro-batch loop, which calls ``process_batched`` directly, so an
unrecoverable OOM is never swallowed by ``skip_op_error``.  The operator's contract (checked per slice
where it can be): row count and order preserved, the same output columns for every slice, a result
independent of the slicing, safe to retry.

Recipe opt-in: ``adaptive_batching: true`` on a registered Mapper applies :class:`AdaptiveBatchingMixin`
under every executor.  Through Data-Juicer's operator metaclass (``compat.dj_ops_internals``), building an
opted-in class gives an ``Adaptive<Class>`` = ``(AdaptiveBatchingMixin, Class)`` instance, created once
per class and reachable by name (PEP 562), so pickles send it by reference.  Rules and refusals:
docs/adaptive-batching.md.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from data_juicer_elastic.batching import runtime
from data_juicer_elastic.batching.engine import PARTITION_COLUMN, Aggregate, MicroBatcher, column
from data_juicer_elastic.batching.policy import BatchPolicy, PolicyConfig, classify_oom
from data_juicer_elastic.compat import dj_ops_internals
from data_juicer_elastic.compat.dj_ops_internals import BASE_OP as BASE_OP_MODULE
from data_juicer_elastic.compat.dj_ops_internals import is_batched_class, op_name, supports_adaptive_batching
from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.quarantine.collector import engine_quarantine

COST_MODES: Final = ("auto", "rows", "text", "padded_text")
# What an operator may define to tune the mixin: :func:`adaptive_class` copies these from the
# operator into ``(AdaptiveBatchingMixin, Op)``, where the mixin's own definitions would shadow them.
HOOKS: Final = (
    "adaptive_batching_cost",
    "adaptive_batching_policy",
    "adaptive_batching_order_columns",
    "adaptive_batching_sort",
    "adaptive_cost_mode",
    "adaptive_row_costs",
)


class AdaptiveBatchingMixin:
    """Micro-batch a batched Mapper's ``process_batched`` under an OOM-learning controller."""

    # Data-Juicer's class-level opt-in flag: this operator honours the contract above.
    _supports_adaptive_batching: ClassVar[bool] = True
    # Cost of a micro-batch, one of COST_MODES (docs/adaptive-batching.md, "Cost models and sorting").
    adaptive_batching_cost: ClassVar[str] = "auto"
    adaptive_batching_policy: ClassVar[PolicyConfig | None] = None
    # Columns that must come back unchanged and in order (besides the partition tag and index_key).
    adaptive_batching_order_columns: ClassVar[tuple[str, ...]] = ()
    # With a cost model, cut an outer batch in descending cost order, then restore the order.
    adaptive_batching_sort: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._adaptive_enabled = adaptive_requested(type(self), getattr(self, "adaptive_batching", None))
        if self._adaptive_enabled:
            check_operator(self)
            # Mapper.__init__ set self.process to process_batched under the skip_op_error wrapper.
            self.process = self._adaptive_process

    def adaptive_cost_mode(self, batch: Any) -> tuple[str, Aggregate]:
        mode = self.adaptive_batching_cost
        if mode == "auto":
            texts = column(batch, getattr(self, "text_key", "text"))
            mode = "text" if texts and isinstance(texts[0], str) else "rows"
        return mode, ("padded" if mode == "padded_text" else "sum")

    def adaptive_row_costs(self, batch: Any) -> Sequence[float] | None:
        """Per-row costs of ``batch`` (None: every row costs 1).  Override for images, audio, tokens."""
        mode, _ = self.adaptive_cost_mode(batch)
        if mode == "rows":
            return None
        texts = column(batch, getattr(self, "text_key", "text")) or []
        return [float(len(t)) + 1.0 if isinstance(t, str) else 1.0 for t in texts]

    def _adaptive_process(self, samples: Any, *args: Any, **kwargs: Any) -> Any:
        mode, _ = self.adaptive_cost_mode(samples)
        state = runtime.state_for(self, mode)
        fn = lambda piece: self.process_batched(piece, *args, **kwargs)  # noqa: E731
        batcher = self.adaptive_batcher(
            samples, fn, state.policy, label=state.label, stats=state.stats, quarantine=self._quarantine(fn)
        )
        try:
            return batcher(samples)
        finally:
            state.after_call()

    def _quarantine(self, fn: Any) -> Any:
        """Under elastic_sharded with skip_op_error: bisect a failed slice, keep its good rows (quarantine)."""
        if not getattr(self, "skip_op_error", False):
            return None

        return engine_quarantine(self, fn, fatal=lambda exc: classify_oom(exc) is not None)

    def adaptive_batcher(self, samples: Any, fn: Any, policy: BatchPolicy, **engine: Any) -> MicroBatcher:
        """The micro-batch loop this operator runs over ``samples`` (``engine`` adds or overrides
        :class:`.engine.MicroBatcher` arguments: the process-wide state, or a benchmark's clock)."""
        mode, aggregate = self.adaptive_cost_mode(samples)
        order = [PARTITION_COLUMN, *self.adaptive_batching_order_columns]
        index_key = getattr(self, "index_key", None)
        if isinstance(index_key, str):
            order.append(index_key)
        options: dict[str, Any] = {
            "row_costs": None if mode == "rows" else self.adaptive_row_costs,
            "aggregate": aggregate,
            "skip_errors": bool(getattr(self, "skip_op_error", False)),
            "order_columns": order,
            "sort_by_cost": bool(self.adaptive_batching_sort) and mode != "rows",
        }
        return MicroBatcher(fn, policy, **(options | engine))

    def adaptive_batching_stats(self) -> dict[str, Any] | None:
        """This process's size-trace summary for this operator (None when micro-batching is off)."""
        if not getattr(self, "_adaptive_enabled", False):
            return None

        return runtime.summary_for(self)


def adaptive_requested(cls: type, requested: bool | None) -> bool:
    """The recipe's ``adaptive_batching`` wins; unset, the class flag decides."""
    return bool(requested) if requested is not None else supports_adaptive_batching(cls)


def check_operator(op: Any) -> None:
    """Refuse configurations the mixin cannot serve (ConfigError naming the operator), and a Data-Juicer
    without the stage identity functions its profiles are keyed by (IntegrationError naming the function)."""
    dj_ops_internals.check_identity_functions()
    name = op_name(op)
    check_settings(type(op), name, batched=op.is_batched_op(), num_gpus=getattr(op, "num_gpus", None))
    batch_size = getattr(op, "batch_size", None)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"adaptive batching needs an integer batch_size >= 1, got {batch_size!r}", where=name)
    mode = getattr(op, "adaptive_batching_cost", "auto")
    if mode not in COST_MODES:
        raise ConfigError(f"adaptive_batching_cost must be one of {', '.join(COST_MODES)}, got {mode!r}", where=name)


def check_settings(
    cls: type, name: str, *, batched: bool | None = None, num_gpus: Any = None, position: int | None = None
) -> None:
    """The refusals a recipe's opt-in (:func:`check_config`, as the recipe is parsed) and an operator
    being built (:func:`check_operator`) share, in one wording.  ``batched`` None: not known yet (only the
    class is); ``position``: the operator's index in the recipe's ``process`` list, when known."""
    place = name if position is None else f"process[{position}] {name}"
    hint = f"remove adaptive_batching from {name} or set it to false"
    mapper = getattr(sys.modules.get(BASE_OP_MODULE), "Mapper", None)
    if mapper is not None and not issubclass(cls, mapper):
        kind = next((b.__name__ for b in cls.__mro__ if b.__module__ == BASE_OP_MODULE), cls.__name__)
        raise ConfigError(
            f"adaptive batching applies to batched Mappers only; {name} is a {kind}",
            where=f"{place}.adaptive_batching",
            hint=hint,
        )
    if batched is False:
        raise ConfigError(
            "adaptive batching needs a batched Mapper (one that implements process_batched)",
            where=f"{place}.adaptive_batching",
            hint=hint,
        )
    if num_gpus is not None and not (isinstance(num_gpus, (int, float)) and 0 <= num_gpus <= 1):
        raise ConfigError(
            f"adaptive batching supports at most one GPU per actor, got num_gpus={num_gpus!r}",
            where=f"{place}.num_gpus",
            hint="a multi-GPU actor shards its model; set num_gpus <= 1 or turn adaptive_batching off",
        )


ENV_SWITCH: Final = "DJ_ELASTIC_ADAPTIVE_BATCHING"
_PREFIX: Final = "Adaptive"

_lock = threading.Lock()
_classes: dict[type, type] = {}


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in ("0", "off", "false", "no")


def adaptive_class(cls: type) -> type:
    """``(AdaptiveBatchingMixin, cls)``, created once; ``cls`` itself when it has the mixin already."""
    if issubclass(cls, AdaptiveBatchingMixin):
        return cls
    with _lock:
        found = _classes.get(cls)
        if found is None:
            # Adaptive<Name>_<hex of module:qualname>: an identifier that names its base class
            name = f"{_PREFIX}{cls.__name__}_{f'{cls.__module__}:{cls.__qualname__}'.encode().hex()}"
            found = type(cls)(
                name,
                (AdaptiveBatchingMixin, cls),
                {
                    "__module__": __name__,
                    "__qualname__": name,
                    "__doc__": f"{cls.__qualname__} with adaptive micro-batching (data-juicer-elastic).",
                    "_adaptive_base": cls,
                    **_operator_hooks(cls),
                },
            )
            _classes[cls] = found
            globals()[name] = found
    return found


def _operator_hooks(cls: type) -> dict[str, Any]:
    """The mixin hooks ``cls`` (which has no mixin in its bases) defines, as raw class attributes
    (staticmethod/classmethod/property keep their kind)."""
    owners = {name: next((klass for klass in cls.__mro__ if name in vars(klass)), None) for name in HOOKS}
    return {name: vars(owner)[name] for name, owner in owners.items() if owner is not None}


def __getattr__(name: str) -> Any:  # PEP 562: unpickling an Adaptive class in a fresh process
    if name.startswith(_PREFIX) and "_" in name:
        try:
            module_name, _, qualname = bytes.fromhex(name.rsplit("_", 1)[1]).decode().partition(":")
        except ValueError:
            raise AttributeError(name) from None
        base: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            base = getattr(base, part)
        cls = adaptive_class(base)
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve(cls: type, requested: Any) -> type:
    """The class to instantiate for ``cls`` with the recipe's ``adaptive_batching`` value."""
    if issubclass(cls, AdaptiveBatchingMixin) or not enabled():
        return cls
    if not adaptive_requested(cls, requested if isinstance(requested, bool) else None):
        return cls
    check_settings(cls, op_name(cls))
    return adaptive_class(cls)


def check_config(cfg: Any) -> None:
    """Refuse recipes whose opted-in operators cannot be micro-batched (ConfigError naming the op)."""
    if not enabled():
        return
    process = _get(cfg, "process") or []
    try:
        from data_juicer.ops.base_op import OPERATORS
    except ImportError:  # pragma: no cover - Data-Juicer moved it; construction still checks
        return
    opted: list[tuple[int, str, type, dict]] = []
    for position, entry in enumerate(process):
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        name, args = next(iter(entry.items()))
        cls = OPERATORS.modules.get(name)
        args = args if isinstance(args, dict) else {}
        requested = args.get("adaptive_batching")
        if cls is not None and adaptive_requested(cls, requested if isinstance(requested, bool) else None):
            opted.append((position, name, cls, args))
    if not opted:
        return
    names = ", ".join(name for _, name, _, _ in opted)
    if _get(cfg, "elastic_juicer_adaptive_batching"):
        raise ConfigError(
            f"operator(s) {names} opt into adaptive batching, which data-juicer-elastic applies itself; "
            "elastic_juicer_adaptive_batching: true would wrap them a second time with Data-Juicer's controller",
            where=f"{opted[0][1]}.adaptive_batching",
            hint="remove elastic_juicer_adaptive_batching (recommended), or set the environment variable "
            f"{ENV_SWITCH}=off to use Data-Juicer's built-in controller instead",
        )
    if _get(cfg, "op_fusion"):
        raise ConfigError(
            f"adaptive batching cannot micro-batch fused operators ({names} opted in)",
            where="op_fusion",
            hint="set op_fusion: false, or turn adaptive_batching off",
        )
    for position, name, cls, args in opted:
        batched = is_batched_class(cls) or bool(args.get("batch_mode"))  # as Data-Juicer's OP.is_batched_op
        check_settings(cls, name, batched=batched, num_gpus=args.get("num_gpus"), position=position)


def _get(cfg: Any, key: str) -> Any:
    getter = getattr(cfg, "get", None)
    return getter(key, None) if callable(getter) else getattr(cfg, key, None)
