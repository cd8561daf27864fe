"""The class under load: students and simulated users on one class server, with the teacher's
page open in chromium the whole time (`benchmarks.classroom`'s `load` scenario).

The scenario starts the class server itself (`ClassServer.start`, so it holds the admin key)
and hands it to the app through server-side configuration (`SERVELAB_CLASS_*`), so the teacher
connects with the page's "Connect to" button. The teacher adds simulated users with the page's
own button (short answers: `benchmarks.load --max-tokens-scale 0.25`); meanwhile students each
ask two questions through `POST /class/ask`, the route the students' page streams from. All are
served, none refused, no block is leaked and nothing is left running (the server's own gauges,
read with the admin key), the server's success count agrees with the clients', and the
teacher's page keeps redrawing: its "redrawn in N ms · K steps received" line moves on through
the run. make test runs a small class; make test-soak the full one (1,000 users, 30 students),
whose figures `python -m benchmarks.classroom load` writes.
"""

from __future__ import annotations

import pytest

from benchmarks.classroom import run_load

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("users,students", [
    (100, 8), pytest.param(1000, 30, marks=pytest.mark.soak)], ids=["small", "soak"])
def test_students_and_simulated_users_on_one_class_server(tmp_path, chromium, users, students):
    seen = run_load(users, students, questions_each=2, tmp=tmp_path, browser=chromium)
    answers = seen["answers"]
    assert len(answers) == students * 2, answers
    assert all(a["status"] == 200 and a["end"] == "done" and a["tokens"] for a in answers), [
        a for a in answers if a["end"] != "done"][:3]
    # the teacher's page redrew throughout: steps kept arriving
    steps = seen["steps"]
    assert len(steps) > 5 and steps[-1] > steps[0] + 20, steps[-10:]
    assert seen["table_shown"], "the load run's row never reached the table"
    assert seen["page_exceptions"] == 0
    # no leaked blocks, nothing left in the server, every request counted once
    vals = seen["metrics"]
    assert vals["vllm:kv_cache_usage_perc"] == 0
    assert vals["vllm:num_requests_running"] == 0 == vals["vllm:num_requests_waiting"]
    assert vals["vllm:request_success_total"] == users + students * 2
