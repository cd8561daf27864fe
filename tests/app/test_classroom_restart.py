"""Flipping a class switch restarts the class engine (`ClassRoom.restart`, what the Classroom
page's button runs): after the answer in flight finishes (that student gets the whole answer),
or at once, aborting it (that student's stream ends without an answer, which the students'
page reports as "the class engine went away: ask again"). Either way the new server runs the
new switches, on a new port with a new join code."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from app.classroom import DEFAULT_SWITCHES, ClassRoom, ClassServer

pytestmark = pytest.mark.slow


def ask(url: str, code: str, out: dict, started: threading.Event) -> None:
    """A student with a long answer; records the event types, or how the stream broke."""
    out["types"] = []
    try:
        with httpx.stream("POST", f"{url}/class/ask", timeout=120, json={
                "nickname": "ann", "question": "Write a long poem about the sea."},
                headers={"Authorization": f"Bearer {code}"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out["types"].append(json.loads(line[6:])["type"])
                    if out["types"][-1] == "delta":
                        started.set()
    except httpx.HTTPError as exc:
        out["broke"] = type(exc).__name__
    started.set()


def restart_while_answering(room: ClassRoom, switches: dict, abort: bool) -> dict:
    old = room.server
    out, started = {}, threading.Event()
    student = threading.Thread(target=ask, args=(old.url, old.join_code, out, started))
    student.start()
    assert started.wait(120) and "delta" in out["types"], out
    room.restart(switches, abort=abort)
    deadline = time.monotonic() + 240
    while (room.status or room.server is old or room.server is None) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    student.join(120)
    assert not room.error, room.error
    new = room.server
    assert new is not None and new is not old and new.url != old.url
    assert new.join_code != old.join_code and old.proc.poll() is not None
    cfg = new.get("/v1/servelab/config").json()
    assert (cfg["batching"], cfg["kv_layout"]) == (switches["batching"], switches["kv_layout"])
    # what a second teacher tab adopting this server reads back: the same switches
    assert ClassServer.adopt({"url": new.url, "join_code": new.join_code,
                              "admin_key": new.admin_key}).switches == switches
    return out


def test_switches_restart_the_class_engine():
    room = ClassRoom()
    try:
        room.start(DEFAULT_SWITCHES, on_network=False)
        static = {**DEFAULT_SWITCHES, "batching": "static", "kv_layout": "contiguous"}
        aborted = restart_while_answering(room, static, abort=True)
        assert "done" not in aborted["types"], aborted  # cut off, not answered
        # back to continuous + paged, now with the int4 twin drafting behind prompt lookup
        drafting = {**DEFAULT_SWITCHES, "spec": "draft", "adaptive_k": True,
                    "lookup_first": True}
        drained = restart_while_answering(room, drafting, abort=False)
        assert drained["types"][-1] == "done" and "broke" not in drained, drained
    finally:
        room.stop()
