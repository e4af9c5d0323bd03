"""The oracle for lossless-output tests: equality as JSON values *and* types."""

from __future__ import annotations

import math
from typing import Any


def strict_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values and types, object key order included; doubles bit for bit
    (``-0.0`` is not ``0.0``, ``193`` is not ``193.0``, ``True`` is not ``1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(strict_equal, a, b))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b
