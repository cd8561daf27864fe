"""Benchmarks and the things they measure against: the naive server (`baseline.py`), the
named workloads (`workloads.py`), and one module per measurement (`bench.py`: the chapter's
experiment; `spec_bench.py`, `kernel_bench.py`, `bench_memory.py`, `int8_bench.py`).
The engine never imports this package."""
