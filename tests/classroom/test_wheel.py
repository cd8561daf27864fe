"""A wheel built from the work tree serves the class: nothing reads the checkout by a relative
path. The work tree's files (tracked, and new ones git does not ignore) are built into a wheel
(`pip wheel`, not editable) and installed into a fresh venv that sees this environment's
dependencies (a .pth naming its site-packages: a .pth there is not run, so an editable
install's finder stays out) but not the checkout. From a folder outside the checkout,
the installed `servelab class` command then serves a phone's join, the teacher's round from
the packaged self-test, the phone's vote, and a refused vote in the phone's language; and the
installed app (`servelab app`'s script) draws its first page with no exception, its pictures
and recorded benchmarks read from the package."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
JOIN, ADMIN = "join-wheel", "admin-wheel"
START_S = 300.0  # the installed engine loads the model (and may build its C++ kernels)


def run(args: list, cwd: Path, env: dict, timeout: float = 300.0) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}: {proc.returncode}\n{proc.stdout[-2000:]}\n" \
                                 f"{proc.stderr[-2000:]}"
    return proc.stdout


def work_tree_copy(dest: Path) -> None:
    """The files `git` would commit now: no build outputs, no venv, no caches."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the work tree's files")
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, timeout=60)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    for name in filter(None, out.stdout.decode().split("\0")):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the work tree is left out
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.slow
@pytest.mark.heavy
def test_a_wheel_serves_the_class_and_answers_a_vote(tmp_path):
    src, dist, venv, elsewhere = (tmp_path / n for n in ("src", "dist", "venv", "elsewhere"))
    for d in (src, dist, elsewhere):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    work_tree_copy(src)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", dist, src], cwd=tmp_path, env=env)
    wheel = next(dist.glob("servelab-*.whl"))

    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path, env=env)
    py = venv / "bin" / "python"
    purelib = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       cwd=elsewhere, env=env).strip())
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "servelab-test-deps.pth").write_text("".join(f"{p}\n" for p in deps))
    run([py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], cwd=elsewhere,
        env=env)

    where = json.loads(run([py, "-c", (
        "import json, sys, app, classroom, engine, lessons\n"
        "print(json.dumps({'files': [m.__file__ for m in (app, classroom, engine, lessons)],"
        " 'path': sys.path, 'finders': [repr(f) for f in sys.meta_path]}))")],
        cwd=elsewhere, env=env))
    for f in where["files"]:
        assert Path(f).is_relative_to(purelib), f"{f}: not the installed wheel's"
    assert str(ROOT) not in where["path"] and str(src) not in where["path"], where["path"]
    assert not any("editable" in f for f in where["finders"]), where["finders"]

    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    servelab = venv / "bin" / "servelab"  # the console script the wheel installed
    assert "servelab app" in run([servelab, "--help"], cwd=elsewhere, env=env)
    proc = subprocess.Popen(
        [str(servelab), "class", "--port", str(port), "--api-key", JOIN,
         "--admin-key", ADMIN, "--dtype", "float32", "--max-num-seqs", "2",
         "--max-model-len", "128"],
        cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    phone = {"Authorization": f"Bearer {JOIN}"}
    teacher = {"Authorization": f"Bearer {ADMIN}"}
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no answer in {START_S:.0f} s"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.get("/class").status_code == 200  # the page, from the package's files
            pid = c.post("/class/join", headers=phone, json={}).json()["phone"]
            quiz = json.loads((ROOT / "lessons" / "quiz.json").read_text("utf-8"))
            qid = quiz["questions"][0]["id"]
            r = c.post("/v1/servelab/votes/open", headers=teacher,
                       json={"quiz": qid, "seconds": 120})
            assert r.status_code == 200, r.text
            view = c.get("/class/vote", headers={**phone, "X-Phone": pid}).json()
            rid = view["round"]["id"]
            r = c.post("/class/vote", headers={**phone, "X-Phone": pid},
                       json={"round": rid, "choice": 1})
            assert r.status_code == 200 and r.json()["round"]["mine"] == 1, r.text
            r = c.post("/class/vote?lang=zh", headers={**phone, "X-Phone": pid},
                       json={"round": rid, "choice": 99})
            err = r.json()["error"]
            assert r.status_code == 400 and err["code"] == "unknown_choice", r.text
            assert "选项" in err["message"]
            state = c.get("/v1/servelab/votes/state", headers=teacher).json()
            assert state["round"]["qid"] == qid and state["round"]["voted"] == 1, state
    finally:
        proc.terminate()  # this test's own server, by its process id
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()

    # the app, as `servelab app` runs it: the installed script's first page under Streamlit's
    # AppTest, in the fresh venv, from a folder outside the checkout
    out = json.loads(run([py, "-c", (
        "import json, app.cli, assets, pathlib\n"
        "from streamlit.testing.v1 import AppTest\n"
        "at = AppTest.from_file(str(app.cli.MAIN), default_timeout=240)\n"
        "at.run()\n"
        "print(json.dumps({'main': str(app.cli.MAIN), 'exceptions': [str(e.value) for e in "
        "at.exception], 'titles': [t.value for t in at.title], 'icon': pathlib.Path("
        "assets.__file__).with_name('icon.png').is_file(), 'bench': len(list(pathlib.Path("
        "assets.__file__).parent.glob('bench/*.json')))}))")],
        cwd=elsewhere, env=env, timeout=300).strip().splitlines()[-1])
    assert Path(out["main"]).is_relative_to(purelib), out["main"]
    assert out["exceptions"] == [] and out["titles"], out
    assert out["icon"] and out["bench"] > 0, out
