"""A crash of the server loses nothing: pause, `kill -9` the server by pid,
start it again on the same home, and the sandbox resumes with its files.

Runs after the other modules (file order) so that no sandbox of theirs is
running when the server dies."""

from e2b import Sandbox, SandboxState


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
        # Its memory died with the VMM, but the server still knows it and
        # says so in a form the SDK parses (its state enum has only
        # running and paused); an envd call fails cleanly, no hang.
        info = Sandbox.get_info(sandbox_id)
        assert info.sandbox_id == sandbox_id
        killed = Sandbox.kill(sandbox_id)
        assert killed is True
    finally:
        if not killed:
            Sandbox.kill(sandbox_id)
