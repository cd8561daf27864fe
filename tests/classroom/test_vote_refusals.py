"""Every vote route refuses through one handler (`classroom.vote_routes.VoteRoute`): a
`VoteError` leaves as OpenAI's error body with its status, its code and the message in the
request's language (`?lang=`, else Accept-Language), and changes no count. No engine: the votes
router alone, in-process, with the server's error handlers."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from classroom.vote_routes import votes_router
from engine.server.errors import add_error_handlers
from engine.server.metrics import ServerMetrics


@pytest.fixture
def client():
    app = FastAPI()
    add_error_handlers(app, ServerMetrics("refusals"))
    router = votes_router()
    app.include_router(router)
    with TestClient(app) as c:
        c.room = router.classroom
        yield c


def refusal(r, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["type"] in ("invalid_request_error", "rate_limit_error")
    return err["message"]


def test_phone_and_teacher_routes_refuse_in_the_phones_language(client):
    stranger = {"X-Phone": "nobody"}
    for method, path, body in [("GET", "/class/vote", None), ("POST", "/class/vote", {}),
                               ("GET", "/class/test", None), ("POST", "/class/test", {})]:
        zh = refusal(client.request(method, path + "?lang=zh", headers=stranger, json=body),
                     404, "unknown_phone")
        en = refusal(client.request(method, path, json=body, headers={
            **stranger, "Accept-Language": "en-GB"}), 404, "unknown_phone")
        assert "刷新" in zh and "reload" in en
    refusal(client.post("/class/join", json={"nickname": "a\x07b"}), 400, "bad_nickname")
    refusal(client.post("/v1/servelab/votes/lock", json={}), 409, "no_round")
    refusal(client.post("/v1/servelab/votes/hide", json={}), 409, "no_round")

    pid = client.post("/class/join", json={}).json()["phone"]
    assert client.post("/v1/servelab/votes/open", json={"quiz": "ch2"}).status_code == 200
    rid = client.get("/class/vote", headers={"X-Phone": pid}).json()["round"]["id"]
    msg = refusal(client.post("/class/vote?lang=zh", headers={"X-Phone": pid},
                              json={"round": rid, "choice": 99}), 400, "unknown_choice")
    assert "选项" in msg
    assert client.room.current.voters() == 0  # a refused vote changes no count
    client.post("/v1/servelab/votes/lock", json={})
    refusal(client.post("/class/vote", headers={"X-Phone": pid},
                        json={"round": rid, "choice": 1}), 409, "closed")
    # a teacher's malformed request is a 400 naming the field, not a refusal of a vote
    r = client.post("/v1/servelab/votes/open", json={"quiz": "no-such-item"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "quiz"
