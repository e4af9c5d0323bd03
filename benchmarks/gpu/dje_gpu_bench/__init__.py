"""The real-GPU adaptive-batching benchmark's pieces, importable by name in Ray workers.

``benchmarks/gpu`` goes on ``PYTHONPATH`` (the scripts there do it, for their
subprocesses and Ray workers too), and a recipe loads the operator with
``custom_operator_paths: [benchmarks/gpu/dje_gpu_bench]``; importing the package
registers ``elastic_bench_embed_mapper``.  torch and transformers are imported
only when an encoder is built.
"""

from dje_gpu_bench import op  # noqa: F401  (registers the operator)
