"""Warm operators: build a recipe's operators once per worker process and reuse them for every shard.
What stays warm, and when it is rebuilt: docs/warm-operators.md.

Actor-mode operators get long-lived Ray actors, fed shard after shard (:class:`WarmActors`): an
actor-pool ``map_batches`` of an operator becomes a task-mode one whose tasks hand each batch to a
free warm actor.  How, and why it cannot deadlock or reorder: docs/warm-operators.md, "What stays warm".
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Iterator
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import dj_config_internals, ray_internals
from data_juicer_elastic.compat.dj_ops_internals import rebase_op

PER_ATTEMPT_KWARGS: Final = ("work_dir",)  # Data-Juicer's update_op_attr puts the config's work_dir into every op


class _OpActor:
    def __init__(self, op_class: type, args: tuple, kwargs: dict):
        self.op = op_class(*args, **kwargs)

    def call(self, batch: Any, work_dir: str | None) -> Any:
        if work_dir is not None and getattr(self.op, "work_dir", None) != work_dir:
            self.op.work_dir = work_dir
        return self.op(batch)


class _Dispatcher:
    """Hands out the indexes of free warm actors, so concurrent tasks never queue on one actor."""

    def __init__(self, size: int):
        import asyncio

        self.free: asyncio.Queue[int] = asyncio.Queue()
        for index in range(size):
            self.free.put_nowait(index)

    async def acquire(self) -> int:
        return await self.free.get()

    async def release(self, index: int) -> None:
        self.free.put_nowait(index)


def _feed(batch: Any, *, actors: list[Any], dispatcher: Any, work_dir: str | None) -> Any:
    """The task-mode UDF: run ``batch`` on a free warm actor and return its result."""
    import ray

    index = ray.get(dispatcher.acquire.remote())
    try:
        return ray.get(actors[index].call.remote(batch, work_dir))
    finally:
        dispatcher.release.remote(index)


class WarmActors:
    """The warm actor pools of one worker process, by operator key; killed by ``drop``."""

    def __init__(self) -> None:
        self._pools: dict[str, tuple[list[Any], Any]] = {}  # key -> (actors, dispatcher)
        self.created = 0  # warm actors started in this process (tests, logs)

    def __bool__(self) -> bool:
        return bool(self._pools)

    def drop(self) -> None:
        import ray

        pools, self._pools = self._pools, {}
        if not ray.is_initialized():
            return  # the runtime is gone, and its actors with it
        for actors, dispatcher in pools.values():
            for handle in [*actors, dispatcher]:
                with contextlib.suppress(Exception):  # already dead: nothing to free
                    ray.kill(handle)

    def pool(self, op_class: type, args: tuple, kwargs: dict, *, size: int, num_gpus: Any, runtime_env: Any) -> tuple:
        import ray

        steady = {k: v for k, v in kwargs.items() if k not in PER_ATTEMPT_KWARGS}
        key = json.dumps(
            [f"{op_class.__module__}.{op_class.__qualname__}", list(args), steady, size, num_gpus, runtime_env],
            sort_keys=True,
            default=repr,
        )
        pool = self._pools.get(key)
        if pool is None:
            remote = ray.remote(_OpActor).options(num_cpus=0, num_gpus=num_gpus or 0, runtime_env=runtime_env)
            actors = [remote.remote(op_class, tuple(args), dict(kwargs)) for _ in range(size)]
            dispatcher = ray.remote(_Dispatcher).options(num_cpus=0).remote(size)
            pool = self._pools[key] = (actors, dispatcher)
            self.created += size
            logger.info(f"warm operators: started {size} warm actor(s) for {op_class.__name__}")
        return pool

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """While entered, actor-pool ``map_batches`` calls of operators go to the warm actors."""
        with ray_internals.map_batches_replaced(lambda original: _redirect(self, original)):
            yield


def _is_operator_class(fn: Any) -> bool:
    if not isinstance(fn, type):
        return False
    from data_juicer.ops.base_op import OP

    return issubclass(fn, OP)


def _pool_size(compute: Any) -> int | None:
    """The actor count of an ActorPoolStrategy (its largest size when elastic), None for anything else."""
    from ray.data import ActorPoolStrategy

    if not isinstance(compute, ActorPoolStrategy):
        return None
    size = compute.max_size if isinstance(compute.max_size, int) and compute.max_size > 0 else compute.min_size
    return max(int(size or 1), 1)


def _redirect(warm: WarmActors, original: Any) -> Any:
    @functools.wraps(original)
    def map_batches(self, fn, *args, **kwargs):
        size = _pool_size(kwargs.get("compute"))
        if args or size is None or not _is_operator_class(fn) or kwargs.get("fn_args") or kwargs.get("fn_kwargs"):
            return original(self, fn, *args, **kwargs)
        from ray.data import TaskPoolStrategy

        ctor_args = tuple(kwargs.pop("fn_constructor_args", None) or ())
        ctor_kwargs = dict(kwargs.pop("fn_constructor_kwargs", None) or {})
        kwargs.pop("fn_args", None), kwargs.pop("fn_kwargs", None)
        num_gpus = kwargs.pop("num_gpus", None)
        actors, dispatcher = warm.pool(
            fn, ctor_args, ctor_kwargs, size=size, num_gpus=num_gpus, runtime_env=kwargs.get("runtime_env")
        )
        udf = functools.partial(_feed, actors=actors, dispatcher=dispatcher, work_dir=ctor_kwargs.get("work_dir"))
        kwargs["compute"] = TaskPoolStrategy(size=size)
        return original(self, udf, **kwargs)

    return map_batches


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
