"""Keep Data-Juicer from installing torch when nothing needs it.

Every Mapper and Filter that Data-Juicer's default executor runs (``dj-process`` with
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
import importlib.util
import sys
from types import ModuleType

ORIGINAL = "__dj_elastic_original__"  # same marker as integration.patches.ORIGINAL


def torch_installed() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def patch_free_models(base_op: ModuleType) -> bool:
    """Wrap ``base_op.free_models`` (the name the operators call); False when it is not there."""
    original = getattr(base_op, "free_models", None)
    if not callable(original) or getattr(original, ORIGINAL, None) is not None:
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
