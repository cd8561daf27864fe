"""`python -m benchmarks.bench_memory`: resident memory of four engines in one process, as the app
keeps them (one per switch setting, 8 seats each), with the model shared (the default) and
with a separate copy per engine (`--separate`, what every engine had before sharing)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.config import EngineConfig, SpecConfig
from engine.engine import LLMEngine
from engine.model import weights_cache

SWITCHES = [{}, {"batching": "static"}, {"kv_layout": "contiguous"}, {"spec": SpecConfig("ngram")}]


def rss_mb() -> float:
    """This process's resident set size (Linux /proc), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1e3
    raise OSError("no VmRSS in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_memory", description=__doc__)
    ap.add_argument("--separate", action="store_true", help="one model copy per engine")
    args = ap.parse_args(argv)
    engines = []
    print(f"start: {rss_mb():.0f} MB")
    for kw in SWITCHES:
        if args.separate:
            weights_cache.clear("model")  # the next engine builds its own model
        engines.append(LLMEngine(EngineConfig(max_num_seqs=8, **kw)))
        print(f"{len(engines)} engine(s), last {kw or 'default'}: {rss_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
