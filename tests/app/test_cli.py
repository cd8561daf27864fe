"""The `servelab` command (app/cli.py): its subcommands reach the same mains as `python -m`,
with their own arguments, and a wrong command says what the right ones are. The installed
command itself is run from a wheel in tests/classroom/test_wheel.py."""

from __future__ import annotations

import sys

import pytest

from app import cli


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in cli.COMMANDS:
        assert f"servelab {cmd}" in out
    assert cli.main([]) == 2


def test_an_unknown_command_is_named_with_the_right_ones(capsys):
    assert cli.main(["srve"]) == 2
    err = capsys.readouterr().err
    assert "'srve'" in err and "serve" in err and "class" in err


def test_a_subcommand_gets_its_own_arguments_as_python_m_would(monkeypatch):
    seen = {}

    def fake_main(argv):
        seen["argv"], seen["sys.argv"] = argv, list(sys.argv)
        return 0

    monkeypatch.setattr("engine.trace.main", fake_main)
    assert cli.main(["trace", "run.jsonl.gz", "-o", "t.json"]) == 0
    assert seen == {"argv": ["run.jsonl.gz", "-o", "t.json"],
                    "sys.argv": ["engine.trace", "run.jsonl.gz", "-o", "t.json"]}


def test_serve_help_is_the_servers(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--help"])
    assert exc.value.code == 0 and "--max-num-seqs" in capsys.readouterr().out


def test_app_runs_streamlit_on_the_installed_script(monkeypatch):
    calls = []
    monkeypatch.setattr("subprocess.call", lambda cmd: calls.append(cmd) or 0)
    assert cli.main(["app", "--server.port", "8600"]) == 0
    (cmd,) = calls
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(cli.MAIN)]
    assert cmd[-2:] == ["--server.port", "8600"] and "--server.headless" in cmd
    assert cli.MAIN.name == "main.py" and cli.MAIN.is_file()
