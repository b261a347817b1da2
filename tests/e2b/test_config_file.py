"""`siesta.toml` (issue 15): a server takes its address and log format from
the configuration file in its home, and a key it does not know stops it
with the key named rather than being ignored."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx

from conftest import BINARY, _build_template, _prepare_home
from server import SiestaServer, net_tag, netns_of


def test_the_server_reads_its_configuration_file(tmp_path):
    home = _prepare_home()
    log = tmp_path / "siesta.log"
    # Its own network tag: the session's server runs meanwhile.
    server = SiestaServer(BINARY, home, log, second=True)
    try:
        _build_template(home, log)
        (home / "siesta.toml").write_text(
            f'[server]\nlisten = "127.0.0.1:{server.port}"\nlog_format = "json"\n'
            '[node]\nvcpus = 1\nresume_ready_timeout_secs = 45\n'
        )
        server.start(listen_flag=False)
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert server.api("GET", "/templates").status_code == 200
        lines = [l for l in log.read_text().splitlines() if l.startswith("{")]
        assert lines, "no JSON log lines"
        assert all("level" in json.loads(l) for l in lines)
    finally:
        server.stop()
        leftovers = netns_of(server.tag)
        shutil.rmtree(home, ignore_errors=True)
    assert not leftovers


def test_an_unknown_key_stops_the_server_and_is_named(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "siesta.toml").write_text("[node]\nmax_slot = 4\n")
    done = subprocess.run(
        [str(BINARY), "serve", "--listen", "127.0.0.1:1"],
        env={
            "SIESTA_HOME": str(home),
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            # Never the session server's slots, should it get that far.
            "SIESTA_NET_TAG": net_tag("pd"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "unknown field `max_slot`" in done.stderr, done.stderr
    assert "siesta.toml" in done.stderr


def test_a_full_node_answers_429_and_refuses_a_fork_that_does_not_fit(tmp_path):
    """`max_slots` bounds the sandboxes a node runs: a fork whose children
    cannot all get a network slot is refused whole before anything is
    captured, and a create past the limit is a 429 (the SDKs' rate-limit
    error) that names the setting, not a 500."""
    home = _prepare_home()
    log = tmp_path / "siesta.log"
    server = SiestaServer(BINARY, home, log, second=True)
    try:
        _build_template(home, log)
        (home / "siesta.toml").write_text("[node]\nmax_slots = 3\nwarm_slots = 1\n")
        server.start()

        def create():
            return server.api("POST", "/sandboxes", json={"templateID": "base", "timeout": 120})

        def running():
            r = server.api("GET", "/v2/sandboxes", params={"state": "running,paused"})
            assert r.status_code == 200, r.text
            return sorted(s["sandboxID"] for s in r.json())

        r = create()
        assert r.status_code == 201, r.text
        source = r.json()["sandboxID"]

        # Three slots, the source holds one: at most two children fit.
        r = server.api("POST", f"/sandboxes/{source}/fork", json={"count": 3})
        assert r.status_code == 429, r.text
        message = r.json()["message"]
        assert "3 were asked for" in message and "max_slots" in message, message
        assert running() == [source], "a refused fork started nothing"
        assert server.api("GET", f"/sandboxes/{source}").json()["state"] == "running"

        r = server.api("POST", f"/sandboxes/{source}/fork", json={"count": 1})
        assert r.status_code == 201, r.text
        assert "sandboxID" in r.json()[0]["sandbox"], r.text

        refused = None
        for _ in range(3):
            r = create()
            if r.status_code != 201:
                refused = r
                break
        assert refused is not None, "a node of 3 slots took a fourth sandbox"
        assert refused.status_code == 429, refused.text
        assert "max_slots" in refused.json()["message"], refused.text
        assert 2 <= len(running()) <= 3
        for sid in running():
            assert server.api("DELETE", f"/sandboxes/{sid}").status_code == 204
    finally:
        server.stop()
        leftovers = netns_of(server.tag)
        shutil.rmtree(home, ignore_errors=True)
    assert not leftovers
