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
