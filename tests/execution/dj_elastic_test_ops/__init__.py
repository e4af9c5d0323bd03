"""Operators for tests/execution, loaded through a recipe's ``custom_operator_paths``.

Kept as a top-level package (not imported as ``tests.execution...``) so Ray
workers import it from the runtime's ``py_modules`` by the same name.
"""

import json
import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("dj_elastic_test_slow_head_mapper")
class SlowHeadMapper(Mapper):
    """Sleeps on any batch holding a row whose ``idx`` is below ``slow_below``.

    With the shard split into several blocks, the first block then finishes
    last: without ``preserve_order`` Ray writes it as the last part.
    """

    _batched_op = True

    def __init__(self, slow_below: int = 10, delay: float = 1.0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slow_below = slow_below
        self.delay = delay

    def process_batched(self, samples):
        if any(i < self.slow_below for i in samples["idx"]):
            time.sleep(self.delay)
        return samples


@OPERATORS.register_module("dj_elastic_test_boom_mapper")
class BoomMapper(Mapper):
    """Raises on every row."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def process_single(self, sample):
        raise ValueError("boom: the test operator failed on purpose")


@OPERATORS.register_module("dj_elastic_test_loads_mapper")
class LoadsMapper(Mapper):
    """Records each construction (``load <pid>``) and each batch (``batch <pid> <first idx>``) in
    ``record_path``; raises on the row whose ``idx`` is ``fail_idx`` until ``marker`` exists (it
    creates it): the first attempt at that shard fails, the next succeeds."""

    _batched_op = True

    def __init__(self, record_path: str = "", fail_idx: int = -1, marker: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.record_path, self.fail_idx, self.marker = record_path, fail_idx, marker
        self._record(f"load {os.getpid()}")

    def _record(self, line: str) -> None:
        with open(self.record_path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def process_batched(self, samples):
        self._record(f"batch {os.getpid()} {samples['idx'][0]}")
        if self.fail_idx in samples["idx"] and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError(f"loads mapper: first attempt at idx {self.fail_idx} fails")
        return samples


@OPERATORS.register_module("dj_elastic_test_reshape_mapper")
class ReshapeMapper(Mapper):
    """Adds, deletes and re-types (nested) keys of the rows it picks: ``edits`` is a JSON list of
    ``[path, "delete" | "set", value, every, offset]`` (``path``: keys joined by ``.``), applied to
    the rows whose ``id`` % ``every`` == ``offset``.  Batched, as an operator that adds a column
    to some rows of a batch only must be: the others get None there."""

    _batched_op = True

    def __init__(self, edits: str = "[]", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.edits = json.loads(edits)

    def process_batched(self, samples):
        keys = list(samples)
        rows = [dict(zip(keys, values, strict=True)) for values in zip(*samples.values(), strict=True)]
        rows = [self._edit(row) for row in rows]
        names = list(dict.fromkeys(k for row in rows for k in row))
        return {k: [row.get(k) for row in rows] for k in names}

    def _edit(self, row):
        for path, kind, value, every, offset in self.edits:
            if row.get("id", 0) % every != offset % every:
                continue
            *parents, last = path.split(".")
            target = row
            for key in parents:
                if not isinstance(target.get(key), dict):
                    if kind == "delete":
                        break
                    target[key] = {}
                target = target[key]
            else:
                if kind == "delete":
                    target.pop(last, None)
                else:
                    target[last] = json.loads(json.dumps(value))
        return row


@OPERATORS.register_module("dj_elastic_test_repeat_mapper")
class RepeatMapper(Mapper):
    """Emits every row whose ``idx`` is a multiple of ``every`` twice (a row-making operator)."""

    _batched_op = True

    def __init__(self, every: int = 3, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.every = every

    def process_batched(self, samples):
        picks = [i for i, idx in enumerate(samples["idx"]) for _ in range(2 if idx % self.every == 0 else 1)]
        return {key: [values[i] for i in picks] for key, values in samples.items()}
