"""classify_oom: the narrow list of exceptions a smaller micro-batch can fix."""

from __future__ import annotations

import sys

import pytest

from data_juicer_elastic.batching.policy import OomKind, classify_oom

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), OomKind.TORCH),
        (torch.cuda.OutOfMemoryError("x"), OomKind.TORCH),
        (torch.AcceleratorError("CUDA error: out of memory"), OomKind.ACCELERATOR),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"), OomKind.CUBLAS),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), OomKind.CUDNN),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: can't allocate memory: 8GB"),
            OomKind.CPU_ALLOCATOR,
        ),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), OomKind.TORCH),  # torch < 1.13
        (MemoryError(), OomKind.MEMORY_ERROR),
    ],
)
def test_recoverable(exc, kind):
    assert classify_oom(exc) is kind


@pytest.mark.parametrize(
    "exc",
    [
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),  # sticky
        torch.AcceleratorError("CUDA error: device-side assert triggered"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1, unhandled cuda error, NCCL version 2.18: out of memory"),
        ValueError("out of memory"),  # not an allocation failure type
        RuntimeError("shape mismatch"),
        KeyboardInterrupt(),
    ],
)
def test_not_recoverable(exc):
    assert classify_oom(exc) is None


def test_nccl_dist_backend_error_is_not_an_oom():
    import torch.distributed as dist

    assert classify_oom(dist.DistBackendError("NCCL communicator: out of memory")) is None


def test_ray_host_memory_oom_is_not_a_device_oom():
    ray_exceptions = pytest.importorskip("ray.exceptions")
    host_oom = ray_exceptions.OutOfMemoryError("Task was killed due to the node running low on memory")
    assert classify_oom(host_oom) is None


def test_without_torch_messages_and_memory_error_still_classify(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    assert classify_oom(RuntimeError("CUDA out of memory (simulated)")) is OomKind.TORCH
    assert classify_oom(MemoryError()) is OomKind.MEMORY_ERROR
    assert classify_oom(RuntimeError("boom")) is None


def test_demo_stand_in_is_classified(monkeypatch):
    from data_juicer_elastic.batching.demo import out_of_memory
    from data_juicer_elastic.errors import SimulatedOutOfMemoryError

    exc = out_of_memory("x", use_torch=False)
    assert isinstance(exc, SimulatedOutOfMemoryError)
    assert classify_oom(exc) is OomKind.TORCH
    assert isinstance(out_of_memory("x"), torch.OutOfMemoryError)
