"""Benchmarks and the things they measure against, kept apart from the engine (as
mini-sglang keeps its `benchmark/`): the naive server (`baseline.py`), the named workloads
(`workloads.py`), one module per measurement (`bench.py`: the chapter's experiment;
`spec_bench.py`, `kernel_bench.py`, `bench_memory.py`, `int8_bench.py`, `draft_study.py`),
and what they share (`common.py`), the load generator (`load.py`), and the GPU check (`gpu/`:
`python -m benchmarks.gpu.check --out DIR`). The engine never imports this package: the
commands are `python -m benchmarks.bench` and `python -m benchmarks.load`."""
