"""A real uvicorn server on 127.0.0.1 and a free port, started and stopped by the test.

`running_server(engine, settings)` runs the FastAPI app in a thread of the test process (so
a test may also look at the engine, through the loop's `call`) and stops it on exit. The
engines are small (fp32, few seats, short model length) so the folder runs in well under
two minutes on two cores.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from engine import EngineConfig, LLMEngine

# the configuration every server test shares, and `LLMEngine.generate` is compared against
SMALL = dict(dtype="float32", max_num_seqs=8, max_model_len=256, block_size=16,
             max_num_batched_tokens=256)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(engine, settings=None, start_timeout: float = 30.0, **server_kw):
    from engine.server import create_app
    from engine.server.http import make_server

    app = create_app(engine, settings)
    port = free_port()
    server = make_server(app, "127.0.0.1", port, **server_kw)  # what engine.serve runs
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the test server did not stop"


@pytest.fixture(scope="session")
def engine():
    """One engine for the folder's servers (one at a time; each leaves it empty)."""
    return LLMEngine(EngineConfig(**SMALL))


@pytest.fixture(scope="session")
def server(engine):
    """A server with the default limits, shared by the tests that need nothing special."""
    with running_server(engine) as (url, app):
        yield url, app


def in_loop(app, fn, timeout: float = 30.0):
    """fn(engine) run on the server's stepping thread (the only one that may touch it)."""
    return app.state.loop.call(fn).result(timeout)
