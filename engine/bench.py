"""`python -m engine.bench`: a thin entry point; the benchmarks themselves
live in the `benchmarks` package (`python -m benchmarks.bench` is the same command)."""

from benchmarks.bench import main
from benchmarks.common import spin_openmp_threads

if __name__ == "__main__":
    spin_openmp_threads("benchmarks.bench")
    raise SystemExit(main())
