"""`python -m engine.loadgen`: the thousand users. The load generator lives in the benchmarks
package (`benchmarks/load.py`); this is the command README gives."""

from benchmarks.load import main

if __name__ == "__main__":
    raise SystemExit(main())
