"""Speed, memory and precision benchmarks; run each from the repository root as
``python -m benchmarks.NAME`` (``bash benchmarks/gpu_bench.sh`` for the prepared GPU run)."""
