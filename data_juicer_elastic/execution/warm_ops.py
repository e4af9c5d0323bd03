"""Warm operators: build a recipe's operators once per worker process and reuse them for every shard
(actor-mode ones through ``warm_actors``).  What stays warm, and when it is rebuilt: docs/warm-operators.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import dj_config_internals
from data_juicer_elastic.compat.dj_ops_internals import rebase_op
from data_juicer_elastic.execution.warm_actors import PER_ATTEMPT_KWARGS, WarmActors

ENV_SWITCH: Final = "DJ_ELASTIC_WARM_OPERATORS"
_LOCK = threading.Lock()  # one shard run at a time patches a process's modules


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in {"0", "false", "no", "off"}


def op_key(process_list: Any) -> str:
    """The operator configs without their per-attempt arguments: equal for every shard of a job."""
    stripped = []
    for item in process_list or []:
        (name, args), *_ = dict(item).items()
        args = {k: v for k, v in (args or {}).items() if k not in PER_ATTEMPT_KWARGS}
        stripped.append({name: args})
    return json.dumps(stripped, sort_keys=True, default=repr)


def rebase(ops: list[Any], process_list: Any) -> None:
    """Give cached operators this attempt's per-attempt arguments, as building them anew would."""
    for op, item in zip(ops, process_list, strict=True):
        (_, args), *_ = dict(item).items()
        rebase_op(op, item, {name: args[name] for name in PER_ATTEMPT_KWARGS if args and name in args})


class WarmOperators:
    """Per worker process: the cached operator instances and the warm actors."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._ops: list[Any] | None = None
        self._planned: set[int] = set()  # ids of cached operators calculate_ray_np already sized
        self.actors = WarmActors()
        self.builds = 0  # how often load_ops really ran (tests, logs)

    def load(self, original: Any, process_list: Any, op_env_manager: Any = None) -> list[Any]:
        if op_env_manager is not None:
            return original(process_list, op_env_manager)
        key = op_key(process_list)
        if self._ops is None or key != self._key:
            self._ops, self._key = original(process_list), key
            self._planned = set()
            self.builds += 1
            if self.builds > 1:
                logger.info("warm operators: the operator configs changed; built them again")
        else:
            rebase(self._ops, process_list)
        return list(self._ops)  # callers may reorder or fuse the list, never our cache

    def plan(self, original: Any, operators: Any, *args: Any, **kwargs: Any) -> Any:
        """``calculate_ray_np`` once for the cached operators; a list holding any other (fused) runs it."""
        ops = list(operators) if isinstance(operators, list | tuple) else [operators]
        if ops and all(id(op) in self._planned for op in ops):
            return None
        result = original(operators, *args, **kwargs)
        cached = {id(op) for op in self._ops or ()}
        self._planned |= {id(op) for op in ops} & cached
        return result

    def drop(self, reason: str = "") -> None:
        """Forget the operator instances and kill the warm actors (after a failed shard, on close)."""
        if self._ops is not None or self.actors:
            logger.info(f"warm operators: dropping the warm state{f' ({reason})' if reason else ''}")
        self._ops = self._key = None
        self._planned = set()
        self.actors.drop()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """For one shard run: ``load_ops`` returns the cached operators, actor-mode ops use warm actors."""
        if not enabled():
            yield
            return
        with _LOCK, dj_config_internals.load_ops_replaced(self.load, self.plan), self.actors.serving():
            yield
