"""Speed, memory and precision benchmarks; run each from the repository root as
``python -m benchmarks NAME`` or ``python -m benchmarks.NAME`` (``python -m benchmarks --list``
names them; ``bash benchmarks/gpu_bench.sh`` for the prepared GPU run)."""
