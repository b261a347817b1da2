"""Commands and PTYs through the envd front door (process.Process RPCs)."""

import time

import pytest
from e2b import CommandExitException, PtySize


def test_foreground_command_stdout_and_exit_code(sbx):
    r = sbx.commands.run("echo hi; echo err >&2")
    assert r.exit_code == 0
    assert r.stdout == "hi\n"
    assert r.stderr == "err\n"
    # The SDK runs commands as `user` in /home/user.
    r = sbx.commands.run("whoami; pwd")
    assert r.stdout.split() == ["user", "/home/user"]


def test_streamed_output_arrives_before_the_end(sbx):
    seen = []
    started = time.monotonic()
    sbx.commands.run(
        "echo one; sleep 2; echo two",
        on_stdout=lambda line: seen.append((line, time.monotonic() - started)),
    )
    assert [line for line, _ in seen] == ["one\n", "two\n"]
    # "one" came out while the command still slept, not with "two".
    assert seen[1][1] - seen[0][1] > 1.0, seen


def test_nonzero_exit_raises(sbx):
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("echo out; exit 3")
    assert exc.value.exit_code == 3
    assert exc.value.stdout == "out\n"


def test_envs_and_cwd(sbx):
    r = sbx.commands.run("echo $FOO; pwd", envs={"FOO": "bar"}, cwd="/tmp")
    assert r.stdout == "bar\n/tmp\n"


def test_background_command_and_wait(sbx):
    h = sbx.commands.run("sleep 1; echo bg-done", background=True)
    assert h.pid > 0
    pids = [p.pid for p in sbx.commands.list()]
    assert h.pid in pids
    r = h.wait()
    assert r.exit_code == 0
    assert r.stdout == "bg-done\n"


def test_background_command_survives_disconnect(sbx):
    h = sbx.commands.run("sleep 2; echo reattached", background=True, timeout=0)
    h.disconnect()
    again = sbx.commands.connect(h.pid)
    r = again.wait()
    assert "reattached" in r.stdout


def test_kill_command(sbx):
    h = sbx.commands.run("sleep 600", background=True, timeout=0)
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        h.wait()
    assert sbx.commands.kill(h.pid) is False


def test_stdin(sbx):
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello ")
    sbx.commands.send_stdin(h.pid, "stdin\n")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "hello stdin\n"


def test_pty_create_send_resize(sbx):
    out = bytearray()
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(h.pid, b"stty size; echo marker-$((6*7))\n")
    sbx.pty.send_stdin(h.pid, b"exit\n")
    h.wait(on_pty=lambda data: out.extend(data))
    text = out.decode(errors="replace")
    assert "30 100" in text, text
    assert "marker-42" in text, text


def test_pty_kill(sbx):
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        h.wait()
    assert sbx.pty.kill(h.pid) is False


def test_default_template_has_the_tools_agents_expect(sbx):
    """`base` (issue 10): python3 with ssl, pip and venv, node with npm,
    git, curl and sudo, as the user the SDK runs commands as."""
    checks = [
        "python3 -c 'import json,ssl,venv'",
        "pip --version",
        "node -e 1",
        "npm --version",
        "git --version",
        "curl --version",
        "sudo -n true",
        "ps -p 1 -o comm=",
    ]
    for cmd in checks:
        r = sbx.commands.run(cmd)
        assert r.exit_code == 0, f"{cmd}: {r.stdout}{r.stderr}"
