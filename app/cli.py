"""The `servelab` command (pyproject's console script): one entry point for what a checkout runs
with `make` and `python -m`, so an installed package (`pip install .`, a wheel) starts the same
way without a checkout.

    servelab app [STREAMLIT OPTIONS]   the teaching app (= streamlit run app/main.py)
    servelab serve [FLAGS]             the OpenAI-compatible server (= python -m engine.serve)
    servelab class [FLAGS]             the class server: the server and the students' page
                                       (= python -m classroom.serve)
    servelab generate [FLAGS]          offline generation (= python -m engine.generate)
    servelab bench [FLAGS]             the benchmarks (= python -m benchmarks.bench)
    servelab trace RECORDING -o FILE   a recording as a trace (= python -m engine.trace)

Each subcommand passes its arguments on unchanged; `servelab CMD --help` shows them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MAIN = Path(__file__).resolve().parent / "main.py"  # the app's script, wherever installed


def _app(argv: list[str]) -> int:
    """Streamlit in this interpreter on the installed app/main.py; without options it opens no
    browser tab of its own and sends no usage statistics."""
    defaults = [] if any(a.startswith("--server.headless") for a in argv) else [
        "--server.headless", "true"]
    defaults += [] if any(a.startswith("--browser.gatherUsageStats") for a in argv) else [
        "--browser.gatherUsageStats", "false"]
    cmd = [sys.executable, "-m", "streamlit", "run", str(MAIN), *defaults, *argv]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


def _module(name: str):
    def run(argv: list[str]) -> int:
        import importlib

        # as `python -m name ARGS` sees itself (a bench that re-executes itself reads argv)
        sys.argv = [name, *argv]
        return importlib.import_module(name).main(argv) or 0
    return run


COMMANDS = {
    "app": _app,
    "serve": _module("engine.serve"),
    "class": _module("classroom.serve"),
    "generate": _module("engine.generate"),
    "bench": _module("benchmarks.bench"),
    "trace": _module("engine.trace"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"servelab: unknown command {cmd!r}; one of {', '.join(COMMANDS)} "
              "(servelab --help)", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":
    sys.exit(main())
