"""SSRF through template builds (M7 of the security review): an image build
asked for through the API must not make the node connect to its own
loopback or private networks (its etcd, a metadata service, a local
registry) unless the operator opened them with
`[node] image_registry_private_allow` / SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW.

The target is a listener on 127.0.0.1 that counts the connections it gets.
A server with nothing opened refuses `fromImage` naming it, by address or
by the name `localhost`, with a 400 that names the host, the address and
the setting, and the listener sees nothing. The session's server opens
127.0.0.1/32 (server.py, as for the tests' registries): there the same
request is accepted and the pull does connect."""

from __future__ import annotations

import shutil
import socket
import threading
import time
import uuid

import pytest
from e2b import Template
from e2b.exceptions import BuildException

from conftest import BINARY, _build_template, _prepare_home
from server import SiestaServer


class CountingListener:
    """127.0.0.1:PORT, counting accepted connections (closed at once)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def listener():
    target = CountingListener()
    try:
        yield target
    finally:
        target.close()


def _start_build(server: SiestaServer, image: str):
    created = server.api("POST", "/v3/templates", json={"name": f"ssrf-{uuid.uuid4().hex[:8]}"})
    assert created.status_code == 202, created.text
    body = created.json()
    started = server.api(
        "POST",
        f"/v2/templates/{body['templateID']}/builds/{body['buildID']}",
        json={"fromImage": image},
    )
    return body, started


@pytest.fixture(scope="module")
def closed_server(tmp_path_factory):
    """A second server with no private network opened to API builds."""
    home = _prepare_home()
    log = tmp_path_factory.mktemp("closed") / "siesta.log"
    server = SiestaServer(BINARY, home, log, second=True)
    server.extra_env["SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW"] = ""
    try:
        _build_template(home, log)
        server.start()
        yield server
    finally:
        leftovers = server.stop_and_clean()
        shutil.rmtree(home, ignore_errors=True)
        assert not leftovers, f"network namespaces left by the server: {leftovers}"


def test_an_api_build_from_loopback_is_refused_before_it_connects(closed_server, listener):
    for host, says in [
        ("127.0.0.1", "`127.0.0.1` is a loopback address"),
        ("localhost", "`localhost` resolves to 127.0.0.1, a loopback address"),
    ]:
        image = f"{host}:{listener.port}/v3/kv:x"
        _, started = _start_build(closed_server, image)
        assert started.status_code == 400, started.text
        message = started.json()["message"]
        for part in (image, says, 'image_registry_private_allow = ["127.0.0.1/32"]',
                     "SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW=127.0.0.1/32"):
            assert part in message, message
    # Through the SDK, as a user sees it.
    with pytest.raises(BuildException) as err:
        Template.build(
            Template().from_image(f"127.0.0.1:{listener.port}/team/app:1"),
            f"ssrf-{uuid.uuid4().hex[:8]}",
            api_url=closed_server.url,
            api_key=closed_server.api_key(),
        )
    assert "image_registry_private_allow" in str(err.value), repr(err.value)
    time.sleep(0.5)
    assert listener.accepted == 0, "a refused build connected to the listener"


def test_an_opened_network_is_reached(siesta, listener):
    body, started = _start_build(siesta, f"127.0.0.1:{listener.port}/v3/kv:x")
    assert started.status_code == 202, started.text
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        status = siesta.api(
            "GET", f"/templates/{body['templateID']}/builds/{body['buildID']}/status"
        ).json()
        if status["status"] in ("ready", "error"):
            break
        time.sleep(0.5)
    assert status is not None and status["status"] == "error", status
    # The listener is no registry: the pull reached it and failed there.
    assert listener.accepted > 0, status
    assert "image_registry_private_allow" not in str(status), status
