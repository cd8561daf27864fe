"""`streamlit run SCRIPT` as a child process on a free 127.0.0.1 port, for the browser tests and
the classroom bench: started, waited for (its /_stcore/health, bounded in time) and stopped by
its own process id."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from classroom.client import free_port

ROOT = Path(__file__).resolve().parents[1]  # the checkout: app/main.py and its imports


@contextlib.contextmanager
def streamlit_server(script: Path | str = "app/main.py", env: dict | None = None,
                     log_path: Path | str | None = None, start_timeout_s: float = 120,
                     ) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (url, process) once the server answers; RuntimeError naming the log if it does not
    within start_timeout_s. Output goes to log_path (None: discarded)."""
    port = free_port()
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, stdout=log,
        stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_timeout_s
        while True:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"streamlit run {script} did not start"
                                   + (f"; see {log_path}" if log_path else ""))
            time.sleep(0.5)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        if log is not subprocess.DEVNULL:
            log.close()
