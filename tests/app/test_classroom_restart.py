"""Flipping a class switch swaps the engine inside the class server (`ClassRoom.restart`, what
the Classroom page's button runs): the class keeps its address, join code and process.
After the answer in flight finishes (that student gets the whole answer), or at once,
cutting it (that student's stream ends with `engine_restarting`, on which the students' page
asks again by itself). Either way the server then runs the new switches, and
`ClassRoom.swap_state` (what the page polls) follows the swap to its end."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from classroom.client import DEFAULT_SWITCHES, ClassRoom, ClassServer

pytestmark = pytest.mark.slow


def ask(url: str, code: str, out: dict, started: threading.Event) -> None:
    """A student with a long answer; records the events, or how the stream broke."""
    out["events"] = []
    try:
        with httpx.stream("POST", f"{url}/class/ask", timeout=120, json={
                "nickname": "ann", "question": "Write a long poem about the sea."},
                headers={"Authorization": f"Bearer {code}"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out["events"].append(json.loads(line[6:]))
                    if out["events"][-1]["type"] == "delta":
                        started.set()
    except httpx.HTTPError as exc:
        out["broke"] = type(exc).__name__
    started.set()


def restart_while_answering(room: ClassRoom, switches: dict, abort: bool) -> dict:
    srv = room.server
    url, code, proc = srv.url, srv.join_code, srv.proc
    out, started = {}, threading.Event()
    student = threading.Thread(target=ask, args=(url, code, out, started))
    student.start()
    assert started.wait(120) and out["events"], out
    room.restart(switches, abort=abort, drain_s=60)
    phases = []
    deadline = time.monotonic() + 240
    while room.pending is not None and time.monotonic() < deadline:
        st = room.swap_state()
        phases.append(st and st.get("phase"))
        time.sleep(0.2)
    student.join(120)
    assert not room.error, room.error
    assert room.pending is None and phases[-1] == "serving", phases
    # the same server, address, join code and process
    assert room.server is srv and srv.url == url and srv.join_code == code
    assert srv.proc is proc and proc.poll() is None
    cfg = srv.get("/v1/servelab/config").json()
    assert (cfg["batching"], cfg["kv_layout"]) == (switches["batching"], switches["kv_layout"])
    assert srv.switches == switches
    # what a second teacher tab adopting this server reads back: the same switches
    assert ClassServer.adopt({"url": url, "join_code": code,
                              "admin_key": srv.admin_key}).switches == switches
    # the step stream told the projector
    assert room.stream.restart is not None and room.stream.restart["phase"] == "serving"
    return out


def test_switches_swap_the_class_engine_in_place():
    room = ClassRoom()
    try:
        room.start(DEFAULT_SWITCHES, on_network=False)
        static = {**DEFAULT_SWITCHES, "batching": "static", "kv_layout": "contiguous"}
        cut = restart_while_answering(room, static, abort=True)
        assert cut["events"][-1]["type"] == "error", cut["events"][-2:]
        assert cut["events"][-1]["code"] == "engine_restarting"
        # back to continuous + paged, now with the int4 twin drafting behind prompt lookup
        drafting = {**DEFAULT_SWITCHES, "spec": "draft", "adaptive_k": True,
                    "lookup_first": True}
        drained = restart_while_answering(room, drafting, abort=False)
        assert drained["events"][-1]["type"] == "done" and "broke" not in drained, drained
    finally:
        room.stop()
