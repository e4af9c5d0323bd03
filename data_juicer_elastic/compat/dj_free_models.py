"""py-data-juicer 1.6.1: ``free_models``, wrapped to keep Data-Juicer from installing torch when
nothing needs it.

Target: ``data_juicer.ops.base_op.free_models`` (the name the operators call) and the
``MODEL_ZOO`` dict of the module that defines it (``data_juicer.utils.model_utils``).

Why.  Every Mapper and Filter that Data-Juicer's default executor runs (``dj-process`` with
``executor_type: default``, and ``dj-analyze``) ends with ``free_models()``
(``data_juicer/ops/base_op.py``), which calls ``torch.cuda.empty_cache()``.  ``torch`` there
is Data-Juicer's ``LazyLoader``: when torch is not installed, that one attribute access
makes it ``pip install torch`` from the public index, a CUDA build of several GB, with one
INFO line as the only sign -- for a text-length filter that loads no model at all.

Without torch no model can hold accelerator memory, so there is nothing for
``empty_cache`` to free: the replacement clears the model cache as the original does and
skips torch.  With torch installed, the original runs unchanged.  Operators that really
use torch still make Data-Juicer install it on first use (the README says so, and how to
pick the small CPU build instead).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Final

from data_juicer_elastic.compat import ORIGINAL, dj_moved, import_target, is_installed

MODULE: Final = "data_juicer.ops.base_op"
TARGET: Final = f"{MODULE}.free_models"


def torch_installed() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def install(base_op: ModuleType) -> bool:
    """Wrap ``base_op.free_models``; False when it is not there."""
    original = getattr(base_op, "free_models", None)
    if not callable(original) or is_installed(original):
        return callable(original)
    model_utils = sys.modules.get(getattr(original, "__module__", ""), None)

    @functools.wraps(original)
    def free_models(clear_model_zoo=True):
        if torch_installed():
            return original(clear_model_zoo)
        zoo = getattr(model_utils, "MODEL_ZOO", None)
        if clear_model_zoo and isinstance(zoo, dict):
            zoo.clear()  # what the original does besides moving models off the GPU
        return None

    setattr(free_models, ORIGINAL, original)
    base_op.free_models = free_models
    return True


def self_check() -> str:
    base_op = import_target(MODULE, where=TARGET)
    function = getattr(base_op, "free_models", None)
    original = getattr(function, ORIGINAL, function)
    model_utils = sys.modules.get(getattr(original, "__module__", ""), None)
    if not callable(original) or not isinstance(getattr(model_utils, "MODEL_ZOO", None), dict):
        raise dj_moved(f"{TARGET} or the MODEL_ZOO of its module is missing", where=TARGET)
    return f"{TARGET} and {model_utils.__name__}.MODEL_ZOO found"
