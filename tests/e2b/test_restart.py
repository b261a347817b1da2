"""A crash of the server loses nothing: pause, `kill -9` the server by pid,
start it again on the same home, and the sandbox resumes with its files.

Runs after the other modules (file order) so that no sandbox of theirs is
running when the server dies."""

import pytest
from e2b import Sandbox, SandboxState
from e2b.exceptions import SandboxException


def test_paused_sandbox_survives_kill_9_of_the_server(siesta):
    box = Sandbox.create(template="base", timeout=600, metadata={"suite": "restart"})
    sandbox_id = box.sandbox_id
    try:
        box.files.write("/home/user/state.txt", "survives-restart")
        assert box.pause() is True

        siesta.kill9()
        siesta.start()

        info = Sandbox.get_info(sandbox_id)
        assert info.state == SandboxState.PAUSED
        assert sandbox_id in {
            s.sandbox_id for s in Sandbox.list().next_items()
        }
        same = Sandbox.connect(sandbox_id)
        assert same.files.read("/home/user/state.txt") == "survives-restart"
        assert same.commands.run("cat /home/user/state.txt").stdout == "survives-restart"
    finally:
        Sandbox.kill(sandbox_id)


def test_running_sandbox_after_kill_9_is_reported_not_dropped(siesta):
    box = Sandbox.create(template="base", timeout=600)
    sandbox_id = box.sandbox_id
    killed = False
    try:
        siesta.kill9()
        siesta.start()
        # Its memory died with the VMM. The server still knows it: get_info
        # says it is dead and why (410; the SDK's state enum has only running
        # and paused, so no SandboxDetail is sent), and the raw list shows it
        # under state=dead. Killing it frees its disk.
        with pytest.raises(SandboxException) as err:
            Sandbox.get_info(sandbox_id)
        assert "410" in str(err.value) and "dead" in str(err.value)
        dead = siesta.api("GET", "/v2/sandboxes?state=dead").json()
        listed = [s for s in dead if s["sandboxID"] == sandbox_id]
        assert listed and listed[0]["state"] == "dead" and listed[0]["deadReason"]
        killed = Sandbox.kill(sandbox_id)
        assert killed is True
    finally:
        if not killed:
            Sandbox.kill(sandbox_id)
