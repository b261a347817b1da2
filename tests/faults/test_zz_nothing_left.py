"""Last (file order): after every fault, nothing is left behind. Every
sandbox and snapshot the server knows is removed through the API, the
server stopped cleanly; then no VMM, network namespace or sandbox
directory of its home may remain, and `siesta repo check` finds nothing
to repair."""

from __future__ import annotations

import os
import subprocess

from server import BINARY, netns_of, pids_using


def _cmdline(pid: int) -> str:
    """What a leftover process runs, for the failure message."""
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError as e:
        return f"(gone: {e})"


def test_nothing_is_left(node):
    r = node.api("GET", "/v2/sandboxes?state=running,paused,dead&limit=1000")
    assert r.status_code == 200, r.text
    for s in r.json():
        assert node.api("DELETE", f"/sandboxes/{s['sandboxID']}").status_code in (204, 404)
    for snap in node.api("GET", "/snapshots").json():
        assert node.api("DELETE", f"/templates/{snap['snapshotID']}").status_code in (204, 404)
    node.stop()
    left_running = {pid: _cmdline(pid) for pid in pids_using(node.home)}
    assert left_running == {}, f"processes naming the home left running: {left_running}"
    assert netns_of(node.tag) == [], "network namespaces left"
    left = sorted(p.name for p in (node.home / "sandboxes").iterdir())
    assert left == [], f"sandbox directories left: {left}"
    check = subprocess.run(
        [str(BINARY), "repo", "check"],
        env=dict(os.environ, SIESTA_HOME=str(node.home)),
        capture_output=True, text=True, check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # The next test of a rerun in the same session gets a server again.
    node.start()
