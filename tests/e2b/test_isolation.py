"""Default isolation, tried from inside a guest (issue 12, first check).

A sandbox must not open a connection to anything on the host: not a
listener the test opens on every host address, not the slot's host-side
address, not the API server's port; nor to another sandbox, at its slot
address (its agent port) or the guest address they all share. Only
addresses of this machine are tried. Each attempt is bash's /dev/tcp with a
3 s limit (all at once); the same listener answers the host itself, so the method works.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest
from e2b import Sandbox

from server import netns_of


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


def _slot_addresses(tag: str) -> list[str]:
    """Every IPv4 address inside this server's slot namespaces, and the host
    side of their veths (the root namespace's addresses on them)."""
    addrs = []
    for ns in netns_of(tag):
        out = subprocess.run(["ip", "-n", ns, "-j", "-4", "addr", "show"],
                             capture_output=True, text=True, check=True).stdout
        for link in json.loads(out):
            for a in link.get("addr_info", []):
                if a["local"] != "127.0.0.1":
                    addrs.append(a["local"])
    return sorted(set(addrs))


@pytest.fixture()
def host_listener():
    """A TCP listener on every host address, accepting and closing."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(16)
    srv.settimeout(0.5)
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, peer = srv.accept()
            except OSError:
                continue
            accepted.append(peer)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        stop.set()
        t.join(timeout=5)
        srv.close()


def _reachable(sbx: Sandbox, targets: list[tuple[str, int]]) -> list[str]:
    """The targets a connection from inside `sbx` opened, all tried at
    once (each with a 3 s limit)."""
    tries = " ".join(
        f"(timeout 3 bash -c 'echo > /dev/tcp/{a}/{p}' 2>/dev/null && echo open {a}:{p}) &"
        for a, p in targets
    )
    r = sbx.commands.run(f"{tries} wait", timeout=60)
    return [line.split()[1] for line in r.stdout.splitlines() if line.startswith("open ")]


def test_a_sandbox_reaches_nothing_on_the_host_nor_other_sandboxes(siesta, host_listener):
    port, accepted = host_listener
    host_addrs = _host_addresses()
    assert host_addrs, "the host has no global IPv4 address to try"
    # The method works: the host reaches its own listener.
    with socket.create_connection((host_addrs[0], port), timeout=3):
        pass
    deadline = time.monotonic() + 5
    while not accepted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(accepted) == 1, accepted
    accepted.clear()
    a = Sandbox.create("base", timeout=300)
    b = Sandbox.create("base", timeout=300)
    try:
        # The guest's own loopback works, so a failure below is the network's.
        a.commands.run("python3 -m http.server 7000 --bind 127.0.0.1", background=True)
        assert a.commands.run(
            "for i in $(seq 50); do bash -c 'echo > /dev/tcp/127.0.0.1/7000' 2>/dev/null && exit 0; sleep 0.2; done; exit 1"
        ).exit_code == 0
        assert _reachable(a, [("127.0.0.1", 7000), ("127.0.0.1", 7001)]) == ["127.0.0.1:7000"]
        slot_addrs = _slot_addresses(siesta.tag)
        assert slot_addrs, f"no slot namespaces of tag {siesta.tag}"
        attempts = [(h, port) for h in host_addrs]
        attempts += [(h, siesta.port) for h in host_addrs]
        # Slot addresses: host sides and namespace sides of every slot, at
        # the test's listener, the API port and the agent's port (49983).
        for s in slot_addrs:
            attempts += [(s, port), (s, siesta.port), (s, 49983)]
        reached = _reachable(a, attempts)
        assert not reached, f"sandbox {a.sandbox_id} reached {reached}"
        assert not accepted, f"the host listener accepted connections from {accepted}"
        # The other sandbox is fine and reachable through the front door only.
        assert b.commands.run("echo ok").stdout.strip() == "ok"
    finally:
        a.kill()
        b.kill()
