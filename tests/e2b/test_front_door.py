"""The envd front door on its own: host-based routing to any port a program
in the sandbox listens on, and the 502s the SDK maps."""

import time

import httpx
import pytest


def via_host(siesta, port, sandbox_id, path="/", **kw):
    return httpx.get(
        f"{siesta.url}{path}",
        headers={"Host": f"{port}-{sandbox_id}.siesta.localhost"},
        timeout=30,
        **kw,
    )


def test_host_routing_reaches_envd(siesta, sbx):
    assert via_host(siesta, 49983, sbx.sandbox_id, "/health").status_code == 204


def test_host_routing_reaches_a_program_in_the_sandbox(siesta, sbx):
    has_python = sbx.commands.run("command -v python3 || true").stdout.strip()
    if not has_python:
        pytest.skip("the base image has no python3 to serve HTTP with")
    sbx.files.write("/home/user/www/hello.txt", "served from the sandbox")
    server = sbx.commands.run(
        "cd /home/user/www && exec python3 -m http.server 8000",
        background=True,
        timeout=0,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            resp = via_host(siesta, 8000, sbx.sandbox_id, "/hello.txt")
            if resp.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert resp.status_code == 200, resp.text
        assert resp.text == "served from the sandbox"
    finally:
        server.kill()


def test_closed_port_is_502_port_is_not_open(siesta, sbx):
    resp = via_host(siesta, 8999, sbx.sandbox_id, "/")
    assert resp.status_code == 502
    body = resp.json()
    assert body["code"] == 502
    assert "port is not open" in body["message"]


def test_unknown_sandbox_is_502_was_not_found(siesta):
    resp = via_host(siesta, 49983, "nosuchsandbox0000000", "/health")
    assert resp.status_code == 502
    assert "was not found" in resp.json()["message"]


def test_get_host_names_resolve_and_route_here(sbx):
    """get_host() is {port}-{id}.localhost:{server port}: it resolves to this
    machine (nss-myhostname, installed by make up) and the front door routes
    it by its Host header, with no header and no DNS set up."""
    import httpx

    cmd = sbx.commands.run("python3 -m http.server 8031", background=True)
    try:
        host = sbx.get_host(8031)
        assert host.startswith(f"8031-{sbx.sandbox_id}.localhost:"), host
        status = None
        for _ in range(40):
            try:
                status = httpx.get(f"http://{host}/", timeout=5).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                break
            time.sleep(0.25)
        assert status == 200
    finally:
        cmd.kill()


def test_private_ports_need_the_traffic_token(siesta, sbx):
    """`allowPublicTraffic: false`: a sandbox's ports answer through the
    front door only with its traffic access token; envd keeps its own
    access token, so the SDK works as before. A public sandbox has none."""
    from e2b import Sandbox

    assert sbx.traffic_access_token is None
    box = Sandbox.create("base", timeout=300, network={"allow_public_traffic": False})
    try:
        token = box.traffic_access_token
        assert token
        server = box.commands.run("exec python3 -m http.server 8000", background=True, timeout=0)

        def get(headers):
            return httpx.get(
                f"{siesta.url}/",
                headers={"Host": f"8000-{box.sandbox_id}.siesta.localhost", **headers},
                timeout=30,
            )

        deadline = time.monotonic() + 30
        while True:
            resp = get({"e2b-traffic-access-token": token})
            if resp.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert resp.status_code == 200, resp.text
        for headers in ({}, {"e2b-traffic-access-token": token + "x"}):
            denied = get(headers)
            assert denied.status_code == 403, denied.text
            assert "traffic access token" in denied.json()["message"]
        assert via_host(siesta, 49983, box.sandbox_id, "/health").status_code == 204
        server.kill()
    finally:
        box.kill()
