"""Egress rules from the E2B SDK's create options (issue 12).

A network namespace made by the test stands for "the internet": two
addresses of a /24 from the benchmarking range (198.18.0.0/15), each with an
HTTP listener, reached from the root namespace through a veth pair. Only
those addresses are ever tried, and `ip route get` first shows that they
route to the test's veth. From inside sandboxes: an address rule lets one
through and keeps the other out, allow wins over deny and over internet
off, the rules outlive a pause, and `PUT /sandboxes/{id}/network` changes
them live. What cannot be enforced (domain names) is refused.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import httpx
import pytest
from e2b import Sandbox

PORT = 8080


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture()
def internet(siesta):
    """(allowed address, denied address) in a namespace with listeners."""
    n = os.getpid() % 250
    net = f"198.18.{n}"
    ns = f"siesta-inet-{os.getpid()}"
    host_if, peer_if = f"vinet{os.getpid() % 100000}", "inet0"
    servers: list[subprocess.Popen] = []
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if, "netns", ns)
        _ip("addr", "add", f"{net}.1/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for a in (f"{net}.2/24", f"{net}.3/24"):
            _ip("-n", ns, "addr", "add", a, "dev", peer_if)
        _ip("-n", ns, "link", "set", peer_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        # Replies go back to the slots' addresses through the host.
        _ip("-n", ns, "route", "add", siesta.subnet, "via", f"{net}.1")
        for a in (f"{net}.2", f"{net}.3"):
            route = subprocess.run(["ip", "route", "get", a], capture_output=True,
                                   text=True, check=True).stdout
            assert f"dev {host_if}" in route, route
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "python3", "-m", "http.server", str(PORT),
                 "--bind", a], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for a in (f"{net}.2", f"{net}.3"):
            _wait_listening(a)
        yield f"{net}.2", f"{net}.3"
    finally:
        for p in servers:
            p.kill()
            p.wait(timeout=10)
        subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def _wait_listening(addr: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection((addr, PORT), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _reached(sbx: Sandbox, addrs: list[str]) -> list[str]:
    """The addresses an HTTP request from inside `sbx` got an answer from,
    all tried at once (each with a 3 s limit)."""
    tries = " ".join(
        f"(curl -s -m 3 -o /dev/null http://{a}:{PORT}/ && echo open {a}) &" for a in addrs
    )
    out = sbx.commands.run(f"{tries} wait", timeout=60).stdout
    return sorted(line.split()[1] for line in out.splitlines() if line.startswith("open "))


def test_address_rules_let_one_through_and_keep_the_other_out(siesta, internet):
    allowed, denied = internet
    both = [allowed, denied]
    open_sbx = Sandbox.create("base", timeout=300)
    deny_one = Sandbox.create("base", timeout=300, network={"deny_out": [denied]})
    # Allow wins over deny (everything) and over internet off.
    only_one = Sandbox.create(
        "base", timeout=300, allow_internet_access=False,
        network={"allow_out": [f"{allowed}/32"], "deny_out": ["0.0.0.0/0"]},
    )
    try:
        # The method works: with no rules both answer.
        assert _reached(open_sbx, both) == sorted(both)
        assert _reached(deny_one, both) == [allowed]
        assert _reached(only_one, both) == [allowed]

        # The rules are part of the sandbox: kept across pause and resume.
        assert only_one.pause() is True
        only_one = Sandbox.connect(only_one.sandbox_id)
        assert _reached(only_one, both) == [allowed]

        # And they change live: now the other address only.
        with httpx.Client(base_url=os.environ["E2B_API_URL"],
                          headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=30) as api:
            r = api.put(f"/sandboxes/{deny_one.sandbox_id}/network",
                        json={"denyOut": [allowed]})
            assert r.status_code == 204, r.text
            got = api.get(f"/sandboxes/{deny_one.sandbox_id}").json()
            assert got["network"]["denyOut"] == [f"{allowed}/32"], got
        assert _reached(deny_one, both) == [denied]
    finally:
        for s in (open_sbx, deny_one, only_one):
            s.kill()


def test_rules_that_cannot_be_enforced_are_refused(siesta):
    for network, says in [
        ({"allow_out": ["example.com"]}, "domain rules"),
        ({"deny_out": ["10.0.0.0/40"]}, "longer than 32"),
        ({"mask_request_host": "${PORT}-x.example.com"}, "network.maskRequestHost"),
    ]:
        with pytest.raises(Exception) as err:
            Sandbox.create("base", network=network)
        assert says in str(err.value), (network, str(err.value))
