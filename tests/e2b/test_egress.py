"""Egress rules from the E2B SDK's create options (issue 12).

A network namespace made by the test stands for "the internet": two
addresses of a /24 from the benchmarking range (198.18.0.0/15), each with an
HTTP listener, reached from the root namespace through a veth pair. Only
those addresses are ever tried, and `ip route get` first shows that they
route to the test's veth. From inside sandboxes: an address rule lets one
through and keeps the other out, allow wins over deny and over internet
off, the rules outlive a pause, and `PUT /sandboxes/{id}/network` changes
them live. Domain rules go through the slot's egress proxy, with names
answered by a DNS server the test runs (dns_answer.py, the server's
SIESTA_EGRESS_DNS). What cannot be enforced is refused.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import tempfile
from pathlib import Path

import httpx
import pytest
from dns_answer import DnsAnswer
from e2b import Sandbox

PORT = 8080
HERE = Path(__file__).parent


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture()
def internet(siesta):
    """(allowed address, denied address) in a namespace with listeners:
    HTTP on 8080 and 80, HTTPS on 443, each serving a `who` file that
    names its address."""
    n = os.getpid() % 250
    net = f"198.18.{n}"
    ns = f"siesta-inet-{os.getpid()}"
    host_if, peer_if = f"vinet{os.getpid() % 100000}", "inet0"
    servers: list[subprocess.Popen] = []
    scratch = tempfile.TemporaryDirectory(prefix="siesta-inet-", dir="/var/tmp")
    _ip("netns", "add", ns)
    try:
        cert, key = _self_signed(Path(scratch.name))
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
            site = Path(scratch.name) / a
            site.mkdir()
            (site / "who").write_text(a)
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "python3", str(HERE / "inet_server.py"),
                 a, str(site), str(cert), str(key)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for a in (f"{net}.2", f"{net}.3"):
            for port in (PORT, 80, 443):
                _wait_listening(a, port)
        yield f"{net}.2", f"{net}.3"
    finally:
        for p in servers:
            p.kill()
            p.wait(timeout=10)
        subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        scratch.cleanup()


def _self_signed(dir: Path) -> tuple[Path, Path]:
    cert, key = dir / "cert.pem", dir / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=siesta-egress-test", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    return cert, key


@pytest.fixture()
def dns(siesta):
    """The DNS server the session server's egress proxy asks."""
    server = DnsAnswer(siesta.egress_dns_port)
    try:
        yield server
    finally:
        server.close()


def _wait_listening(addr: str, port: int = PORT) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1):
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
        ({"deny_out": ["example.com"]}, "only allowed in allowOut"),
        ({"allow_out": ["*.com"]}, "a wildcard needs"),
        ({"deny_out": ["10.0.0.0/40"]}, "longer than 32"),
        ({"mask_request_host": "${PORT}-x.example.com"}, "network.maskRequestHost"),
    ]:
        with pytest.raises(Exception) as err:
            Sandbox.create("base", network=network)
        assert says in str(err.value), (network, str(err.value))


def _fetch(sbx: Sandbox, tries: dict[str, str]) -> dict[str, str]:
    """Runs every `curl` argument string of `tries` at once inside `sbx`
    (each with a 5 s limit); the body (or HTTP code, with `-w`) each got,
    "" where the connection failed."""
    script = " ".join(
        f"(out=$(curl -sk -m 5 {args}) && echo \"{key}=$out\" || echo \"{key}=\") &"
        for key, args in tries.items()
    )
    out = sbx.commands.run(f"{script} wait", timeout=60).stdout
    got = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert set(got) == set(tries), out
    return got


def test_domain_rules_go_through_the_egress_proxy(siesta, internet, dns):
    allowed, denied = internet
    dns.answers = {
        "allowed.test": allowed,
        "a.wild.test": allowed,
        "wild.test": allowed,
        "other.test": allowed,
        "rebound.test": denied,
        "local.test": "127.0.0.1",
    }
    network = {
        "allow_out": ["allowed.test", "*.wild.test", "rebound.test", "local.test"],
        "deny_out": ["0.0.0.0/0", f"{denied}/32"],
    }
    sbx = Sandbox.create("base", timeout=300, network=network)
    try:
        # The guest picks the denied address for an allowed name: the proxy
        # connects to what the name resolves to instead (the `who` says so).
        via_wrong = f"--resolve allowed.test:443:{denied} --resolve allowed.test:80:{denied}"
        got = _fetch(sbx, {
            "tls": f"{via_wrong} https://allowed.test/who",
            "http": f"{via_wrong} http://allowed.test/who",
            "wild": f"--resolve a.wild.test:443:{allowed} https://a.wild.test/who",
            "apex": f"--resolve wild.test:443:{allowed} https://wild.test/who",
            "other_tls": f"--resolve other.test:443:{allowed} https://other.test/who",
            "other_http": f"-o /dev/null -w '%{{http_code}}' "
                          f"--resolve other.test:80:{allowed} http://other.test/who",
            "rebound": f"--resolve rebound.test:443:{allowed} https://rebound.test/who",
            "local": f"--resolve local.test:443:{allowed} https://local.test/who",
            "no_name": f"http://{allowed}:{PORT}/who",
        })
        assert got == {
            "tls": allowed, "http": allowed, "wild": allowed,
            # `*.wild.test` is the names below it, not wild.test itself.
            "apex": "",
            # Names no rule allows fall back to the address rules: deny all.
            "other_tls": "", "other_http": "403",
            # An allowed name never leads to a denied or local address.
            "rebound": "", "local": "",
            # Other ports follow the address rules alone.
            "no_name": "",
        }, got
        assert "other.test" not in dns.asked, "names no rule allows are never resolved"

        info = siesta.api("GET", f"/sandboxes/{sbx.sandbox_id}").json()
        assert info["network"]["allowOut"] == network["allow_out"], info["network"]

        # The rules outlive a pause (the resumed VM may get another slot,
        # whose proxy starts with the rules) ...
        assert sbx.pause() is True
        sbx = Sandbox.connect(sbx.sandbox_id)
        got = _fetch(sbx, {
            "allowed": f"--resolve allowed.test:443:{allowed} https://allowed.test/who",
            "other": f"--resolve other.test:443:{allowed} https://other.test/who",
        })
        assert got == {"allowed": allowed, "other": ""}, got

        # ... and change live.
        r = siesta.api("PUT", f"/sandboxes/{sbx.sandbox_id}/network",
                       json={"allowOut": ["other.test"], "denyOut": ["0.0.0.0/0"]})
        assert r.status_code == 204, r.text
        got = _fetch(sbx, {
            "allowed": f"--resolve allowed.test:443:{allowed} https://allowed.test/who",
            "other": f"--resolve other.test:443:{allowed} https://other.test/who",
        })
        assert got == {"allowed": "", "other": allowed}, got
    finally:
        sbx.kill()


def test_rules_follow_snapshots_and_forks(siesta, internet):
    allowed, denied = internet
    both = [allowed, denied]
    source = Sandbox.create("base", timeout=300, network={"deny_out": [denied]})
    made: list[Sandbox] = [source]
    try:
        snap = source.create_snapshot()
        # A create that gives no rules gets the source's ...
        same = Sandbox.create(template=snap.snapshot_id, timeout=300)
        made.append(same)
        # ... one that gives its own gets those.
        own = Sandbox.create(template=snap.snapshot_id, timeout=300,
                             network={"deny_out": [allowed]})
        made.append(own)
        child = source.fork(count=1, timeout=300)[0]
        made.append(child)
        assert _reached(same, both) == [allowed]
        assert _reached(own, both) == [denied]
        assert _reached(child, both) == [allowed]
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    finally:
        for s in made:
            s.kill()
