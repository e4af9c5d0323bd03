"""``elastic_oom_demo_mapper``: a CPU-safe stand-in for a GPU model that runs out of memory above
``capacity``, after editing its input in place as careless model code does (a retry that reused the
failed input would append ``suffix`` twice).  :func:`register` defines it, so importing this module
loads no engine.  See ``recipes/adaptive_batching.yaml``.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from typing import Any

from data_juicer_elastic.errors import SimulatedOutOfMemoryError

NAME = "elastic_oom_demo_mapper"
CLASS_NAME = "ElasticOomDemoMapper"
_LOCK = threading.Lock()  # a Ray worker may unpickle an instance while the plugin registers the class


def out_of_memory(message: str, use_torch: bool = True) -> Exception:
    text = f"CUDA out of memory. {message} (simulated by {NAME})"
    if use_torch and importlib.util.find_spec("torch") is not None:
        import torch

        return torch.OutOfMemoryError(text)
    return SimulatedOutOfMemoryError(text)


def register() -> type:
    """The demo operator's class, defined and registered with Data-Juicer's ``OPERATORS`` on the first call."""
    # Imported before the lock: a first import of Data-Juicer's operators runs the plugin's patches,
    # which call register() themselves (then this call finds the class).
    from data_juicer.ops import base_op

    with _LOCK:
        found = globals().get(CLASS_NAME)
        if found is None:
            found = globals()[CLASS_NAME] = _define(base_op.OPERATORS, base_op.Mapper)
        return found


def __getattr__(name: str) -> Any:
    """``demo.ElasticOomDemoMapper``, by attribute or by pickle, is :func:`register`'s class."""
    if name == CLASS_NAME:
        return register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _define(OPERATORS: Any, Mapper: type) -> type:  # noqa: N803 (Data-Juicer's names)
    class ElasticOomDemoMapper(Mapper):
        """Add ``demo_chars`` (the text's length); run out of memory when a batch needs more than ``capacity``."""

        _batched_op = True

        def __init__(
            self,
            capacity: int = 20000,
            memory_model: str = "sum",
            suffix: str = "",
            seconds_per_call: float = 0.0,
            seconds_per_unit: float = 0.0,
            torch_errors: bool = True,
            *args,
            **kwargs,
        ):
            """
            :param capacity: memory units one call may use (characters for ``sum``, rows x longest text for ``padded``)
            :param memory_model: ``sum`` or ``padded`` (``memory`` is the base operator's Ray memory)
            :param suffix: appended to every text (in place, before the memory check)
            :param seconds_per_call: simulated fixed time of a call
            :param seconds_per_unit: simulated time per memory unit
            :param torch_errors: raise torch.OutOfMemoryError when torch is installed
            """
            super().__init__(*args, **kwargs)
            if memory_model not in ("sum", "padded"):
                raise ValueError(f"{NAME}: memory_model must be 'sum' or 'padded', got {memory_model!r}")
            self.capacity = capacity
            self.memory_model = memory_model
            self.suffix = suffix
            self.seconds_per_call = seconds_per_call
            self.seconds_per_unit = seconds_per_unit
            self.torch_errors = torch_errors

        def process_batched(self, samples):
            texts = list(samples[self.text_key])
            lengths = [len(t) for t in texts]
            if self.suffix:
                for i, text in enumerate(texts):
                    samples[self.text_key][i] = text + self.suffix
            if not lengths:
                samples["demo_chars"] = []
                return samples
            need = sum(lengths) if self.memory_model == "sum" else len(lengths) * max(lengths)
            if need > self.capacity:
                raise out_of_memory(
                    f"Tried to allocate {need} units for {len(lengths)} rows; capacity {self.capacity}",
                    self.torch_errors,
                )
            if self.seconds_per_call or self.seconds_per_unit:
                time.sleep(self.seconds_per_call + need * self.seconds_per_unit)
            samples["demo_chars"] = lengths
            return samples

    # Named as if defined at module level: the class and its methods pickle by reference, not by value.
    ElasticOomDemoMapper.__qualname__ = CLASS_NAME
    for name, value in vars(ElasticOomDemoMapper).items():
        if callable(value) and hasattr(value, "__qualname__"):
            value.__qualname__ = f"{CLASS_NAME}.{name}"
    OPERATORS.register_module(NAME, ElasticOomDemoMapper)
    return ElasticOomDemoMapper
