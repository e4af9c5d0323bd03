"""Which exceptions a smaller micro-batch can fix (:func:`classify_oom`): only a failure of *this process*
to allocate memory for *this call*; never a sticky CUDA error, an NCCL error or Ray's host-memory OOM
(Ray retries the task itself).  torch is never imported here: an exception raised by torch means it is
in ``sys.modules``.
"""

from __future__ import annotations

import enum
import sys
from typing import Final


class OomKind(enum.StrEnum):
    """The allocation failure a smaller micro-batch can recover from."""

    TORCH = "torch"  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError, or its RuntimeError message
    ACCELERATOR = "accelerator"  # torch.AcceleratorError "out of memory" (recent torch; not sticky)
    CUBLAS = "cublas"  # CUBLAS_STATUS_ALLOC_FAILED
    CUDNN = "cudnn"  # CUDNN_STATUS_ALLOC_FAILED
    CPU_ALLOCATOR = "cpu-allocator"  # DefaultCPUAllocator: can't allocate memory
    MEMORY_ERROR = "memory-error"  # Python's MemoryError (a host allocation failed in this process)


# Lower-case message markers of RuntimeErrors, first match wins.
_MESSAGE_MARKERS: Final = (
    ("cublas_status_alloc_failed", OomKind.CUBLAS),
    ("cudnn_status_alloc_failed", OomKind.CUDNN),
    ("can't allocate memory", OomKind.CPU_ALLOCATOR),  # "DefaultCPUAllocator: can't allocate memory"
    ("out of memory", OomKind.TORCH),  # "CUDA out of memory.", "CUDA error: out of memory", "HIP out of memory"
)
# Messages that are never an allocation failure, even if they also say "out of memory".
_NOT_OOM_MARKERS: Final = ("nccl", "illegal memory access", "device-side assert", "unspecified launch failure")


def classify_oom(exc: BaseException) -> OomKind | None:
    """The kind of recoverable allocation OOM ``exc`` is, or None when a smaller batch cannot help."""
    if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit, our own interrupts
        return None
    if any(cls.__module__.split(".", 1)[0] == "ray" for cls in type(exc).__mro__):
        return None  # Ray's host-memory OutOfMemoryError, RayTaskError wrappers
    torch = sys.modules.get("torch")
    if torch is not None:
        distributed_error = getattr(sys.modules.get("torch.distributed"), "DistError", None)
        if distributed_error is not None and isinstance(exc, distributed_error):
            return None  # DistBackendError (NCCL) and friends: not a local allocation
        oom_class = getattr(torch, "OutOfMemoryError", None) or getattr(
            getattr(torch, "cuda", None), "OutOfMemoryError", None
        )
        if oom_class is not None and isinstance(exc, oom_class):
            return OomKind.TORCH
        accelerator_error = getattr(torch, "AcceleratorError", None)
        if accelerator_error is not None and isinstance(exc, accelerator_error):
            # AcceleratorError also carries sticky errors: only its OOM is retryable.
            text = str(exc).lower()
            oom = "out of memory" in text and not any(marker in text for marker in _NOT_OOM_MARKERS)
            return OomKind.ACCELERATOR if oom else None
    if isinstance(exc, MemoryError):
        return OomKind.MEMORY_ERROR
    if isinstance(exc, RuntimeError):
        message = str(exc).lower()
        if any(marker in message for marker in _NOT_OOM_MARKERS):
            return None
        for marker, kind in _MESSAGE_MARKERS:
            if marker in message:
                return kind
    return None
