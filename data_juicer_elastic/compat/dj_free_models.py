"""py-data-juicer 1.6.1: ``data_juicer.ops.base_op.free_models`` (and the ``MODEL_ZOO`` dict of its
module), wrapped to keep Data-Juicer from installing torch when nothing needs it.

Every Mapper and Filter the default executor runs ends with ``free_models()``, whose
``torch.cuda.empty_cache()`` goes through Data-Juicer's ``LazyLoader``: without torch, that makes
it ``pip install torch`` (several GB), even for a text-length filter.  Without torch no model holds
accelerator memory, so the replacement only clears the model cache; with torch, the original runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Final

from data_juicer_elastic.compat import ALREADY, APPLIED, dj_moved, target_function, wrap_function

MODULE: Final = "data_juicer.ops.base_op"
TARGET: Final = f"{MODULE}.free_models"


def torch_installed() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def install(base_op: ModuleType) -> bool:
    """Wrap ``base_op.free_models``; False when it is not there."""

    def make(original):
        model_utils = sys.modules.get(getattr(original, "__module__", ""), None)

        def free_models(clear_model_zoo=True):
            if torch_installed():
                return original(clear_model_zoo)
            zoo = getattr(model_utils, "MODEL_ZOO", None)
            if clear_model_zoo and isinstance(zoo, dict):
                zoo.clear()  # what the original does besides moving models off the GPU
            return None

        return free_models

    return wrap_function(base_op, "free_models", make) in (APPLIED, ALREADY)


def self_check() -> str:
    model_utils = sys.modules.get(target_function(MODULE, "free_models").__module__, None)
    if not isinstance(getattr(model_utils, "MODEL_ZOO", None), dict):
        raise dj_moved(f"the MODEL_ZOO of {TARGET}'s module is missing", where=TARGET)
    return f"{TARGET} and {model_utils.__name__}.MODEL_ZOO found"
