"""How an engine process's OpenMP threads wait, and its startup heap frozen: set by the entry
points, never on import.

Importing `engine` changes nothing process-wide. A process that serves one engine
(`python -m engine.serve`, `python -m engine.generate`) calls `spin_briefly()` before torch
loads: torch's OpenMP (libgomp) reads its wait policy once, when it loads.

Why a short spin: OpenMP's idle worker threads either spin or sleep between the ops of a step.
libgomp's default spins for a long time, and OMP_WAIT_POLICY=ACTIVE alone never stops, so an
idle engine's workers would keep the cores from the server's HTTP thread, which has tokens to
send between steps. SPINCOUNT rounds (tens of microseconds) keep the workers awake between the
ops of one step and give the cores back between steps. ACTIVE keeps libgomp from cutting the
count short where it manages more threads than there are cores (a server may: two of its
threads run torch ops). An explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. The variables are
taken out again once torch has loaded, so a child process (a benchmark's re-exec, a server)
makes its own choice. The app shares two cores with its web server and keeps PASSIVE
(app/main.py); a benchmark re-executes itself with ACTIVE (benchmarks/common.py).
"""

from __future__ import annotations

import gc
import os
import sys

SPINCOUNT = "3000"
_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def spin_briefly() -> bool:
    """Load torch with OMP_WAIT_POLICY=ACTIVE and GOMP_SPINCOUNT=SPINCOUNT, then take both out
    of the environment again. Does nothing where torch is already loaded (too late: libgomp
    has read its policy) or the environment names a policy. True if it set them."""
    if "torch" in sys.modules or any(name in os.environ for name in _VARIABLES):
        return False
    os.environ.update(OMP_WAIT_POLICY="ACTIVE", GOMP_SPINCOUNT=SPINCOUNT)
    try:
        import torch  # noqa: F401  (libgomp loads with torch and reads both now)
    finally:
        for name in _VARIABLES:
            os.environ.pop(name, None)
    return True


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The environment for an engine server started as a child process: the parent's, less
    its OpenMP wait policy (a benchmark's ACTIVE, the app's PASSIVE), so that the server's own
    short spin (spin_briefly) applies."""
    return {k: v for k, v in env.items() if k not in _VARIABLES}


def freeze_startup_heap() -> None:
    """For a process that serves one engine for its whole life (`engine/serve.py`; the GPU
    check while it times one): collect once, then move every object alive into the collector's
    permanent generation (`gc.freeze`, as vLLM does after startup). A full collection while
    serving then scans only what serving allocated, so no step waits on a scan of the
    engine's startup objects (docs/performance.md has the GPU check's figures). Not for a
    process that builds and drops engines (the app): a frozen engine in a reference cycle is
    never collected, and its KV pool with it (`gc.unfreeze()` undoes the freeze)."""
    gc.collect()
    gc.freeze()
