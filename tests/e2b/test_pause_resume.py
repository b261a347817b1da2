"""Pause and resume (connect) with files and processes intact."""

import httpx
import pytest
from e2b import Sandbox, SandboxState, TimeoutException

# Command lines of every process in the guest, one a line (no procps needed).
PROCESSES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | sed 's/ $//'; echo; done"


@pytest.fixture(scope="module")
def paused_box(siesta):
    box = Sandbox.create(template="base", timeout=600)
    try:
        box.files.write("/home/user/state.txt", "persist-me")
        # One process the agent tracks (commands.list shows it) and one the
        # shell detached; timeout=0 so no deadline kills them.
        box.commands.run("sleep 1000", background=True, timeout=0).disconnect()
        box.commands.run("sleep 1001 >/dev/null 2>&1 &")
        yield box
    finally:
        Sandbox.kill(box.sandbox_id)


def test_pause_then_resume_keeps_files_and_processes(paused_box):
    box = paused_box
    before = {p.pid: p.cmd + " " + " ".join(p.args) for p in box.commands.list()}
    assert any("sleep 1000" in c for c in before.values()), before

    assert box.pause() is True
    assert Sandbox.get_info(box.sandbox_id).state == SandboxState.PAUSED
    # Pausing again: already paused (409), which the SDK returns as False.
    assert Sandbox.pause(box.sandbox_id) is False

    same = Sandbox.connect(box.sandbox_id)
    assert same.sandbox_id == box.sandbox_id
    assert Sandbox.get_info(box.sandbox_id).state == SandboxState.RUNNING
    assert same.files.read("/home/user/state.txt") == "persist-me"
    assert same.commands.run("cat /home/user/state.txt").stdout == "persist-me"
    after = {p.pid: p.cmd + " " + " ".join(p.args) for p in same.commands.list()}
    assert any("sleep 1000" in c for c in after.values()), after
    assert "sleep 1001" in same.commands.run(PROCESSES).stdout.splitlines()
    # The access token is stable across pause and resume: the old handle works.
    assert box.files.read("/home/user/state.txt") == "persist-me"


def test_envd_request_does_not_wake_a_sandbox_without_auto_resume(paused_box):
    box = paused_box
    if Sandbox.get_info(box.sandbox_id).state != SandboxState.PAUSED:
        assert box.pause() is True
    # is_running() goes through the front door: it must not resume it.
    assert box.is_running() is False
    with pytest.raises(Exception) as err:
        box.files.read("/home/user/state.txt")
    assert "paused" in str(err.value).lower(), err.value
    assert Sandbox.get_info(box.sandbox_id).state == SandboxState.PAUSED


def test_envd_request_resumes_a_sandbox_with_auto_resume(siesta):
    box = Sandbox.create(
        template="base", timeout=600, lifecycle={"on_timeout": "pause", "auto_resume": True}
    )
    try:
        box.files.write("/home/user/state.txt", "wake-me")
        assert box.pause() is True
        assert Sandbox.get_info(box.sandbox_id).state == SandboxState.PAUSED
        # Its id alone, without its access token, neither wakes it nor keeps
        # it awake: 401, and it stays paused.
        for path in ["/health", "/files?path=/home/user/state.txt"]:
            r = httpx.get(f"{siesta.url}{path}", headers={"E2b-Sandbox-Id": box.sandbox_id})
            assert r.status_code == 401, r.text
        assert Sandbox.get_info(box.sandbox_id).state == SandboxState.PAUSED
        # No connect: the front door resumes it for the SDK's request.
        assert box.files.read("/home/user/state.txt") == "wake-me"
        assert Sandbox.get_info(box.sandbox_id).state == SandboxState.RUNNING
    finally:
        Sandbox.kill(box.sandbox_id)


def test_a_running_command_ends_when_its_sandbox_is_killed(siesta):
    box = Sandbox.create(template="base", timeout=600)
    cmd = box.commands.run("sleep 60", background=True)
    box.kill()
    with pytest.raises(TimeoutException) as err:
        cmd.wait()
    assert "sandbox was killed" in str(err.value), err.value


def test_connect_to_a_running_sandbox(paused_box):
    same = Sandbox.connect(paused_box.sandbox_id)
    assert same.commands.run("echo ok").stdout == "ok\n"
