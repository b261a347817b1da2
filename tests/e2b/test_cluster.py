"""Two siesta nodes and a real 3-member etcd (issue 13, docs/cluster.md §3).

Nodes A and B run on this machine with their own homes, network tags and
subnets, one API key, SeaweedFS as their object store and a 3-member etcd
as their cluster state. With the official E2B SDK: a sandbox created and
paused on A resumes through B's API (B forwards control calls and envd
traffic to A, which owns it) with its files and a process intact; then A
is killed with SIGKILL, and once its lease expired the sandbox, paused
again, is taken over by B (its pause fetched from the object store) and
resumes there, files and process intact; A, started again, finds the
sandbox moved and forwards to B instead of resuming its stale copy. A
node stopped cleanly hands its sandboxes over at once. What the nodes
write to etcd is sealed with their cluster key (no token or env var in
the clear), and a node checks the API key or the sandbox's token before
it forwards a request (a request without them never reaches A)."""

from __future__ import annotations

import os
import shutil
import time

import httpx
import pytest
from e2b import Sandbox

import cluster_infra
from conftest import BINARY, _prepare_home
from server import SiestaServer, net_subnet, net_tag, netns_of

LEASE_SECS = 3


@pytest.fixture(scope="module")
def cluster_key(tmp_path_factory):
    """The key file the nodes share (32 random bytes, mode 0600)."""
    path = tmp_path_factory.mktemp("cluster-key") / "cluster.key"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def infra():
    why = cluster_infra.missing()
    if why:
        pytest.fail(f"the cluster test cannot run: {why}")
    etcd, weed = cluster_infra.Etcd(), cluster_infra.Weed()
    try:
        etcd.start()
        weed.start()
        yield etcd, weed
    finally:
        weed.stop()
        etcd.stop()


def _node(name: str, tag: str, subnet: str, tmp_path_factory, etcd, weed, key) -> SiestaServer:
    home = _prepare_home()
    log = tmp_path_factory.mktemp(f"node-{name}") / "siesta.log"
    node = SiestaServer(BINARY, home, log)
    node.tag, node.subnet = tag, subnet
    node.extra_env = {
        "SIESTA_ETCD_ENDPOINTS": ",".join(etcd.client_urls),
        "SIESTA_NODE_ID": name,
        "SIESTA_NODE_LEASE_SECS": str(LEASE_SECS),
        "SIESTA_CLUSTER_KEY_FILE": str(key),
        # The test's etcd listens on 127.0.0.1 only, in plain HTTP
        # (TLS and auth against a real etcd: crates/cluster/tests).
        "SIESTA_INSECURE_ETCD": "true",
        **weed.env(),
    }
    return node


@pytest.fixture(scope="module")
def nodes(infra, tmp_path_factory, cluster_key):
    etcd, weed = infra
    # Tags and subnets of neither the session's server nor the config test's.
    a = _node("a", net_tag("ca"), net_subnet(190, 5), tmp_path_factory, etcd, weed, cluster_key)
    b = _node("b", net_tag("cb"), net_subnet(195, 5), tmp_path_factory, etcd, weed, cluster_key)
    leftovers: list[str] = []
    try:
        a.start()
        # One API key for the cluster: B gets A's.
        (b.home / "secrets").mkdir(mode=0o700, exist_ok=True)
        shutil.copy2(a.home / "secrets" / "api-key", b.home / "secrets" / "api-key")
        b.start()
        yield a, b
    finally:
        for n in (a, b):
            leftovers += n.stop_and_clean()
            print(f"\n{n.log_path}:\n{n.log_tail(25)}")
            shutil.rmtree(n.home, ignore_errors=True)
    assert not leftovers, f"network namespaces left: {leftovers}"


def _point_sdk(monkeypatch, node: SiestaServer) -> None:
    for var in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL"):
        monkeypatch.setenv(var, node.url)
    monkeypatch.setenv("E2B_API_KEY", node.api_key())


def _counter(box: Sandbox) -> tuple[int, int]:
    """The pid of the counting process and the count it reached."""
    pid = int(box.commands.run("cat /tmp/counter.pid").stdout.strip())
    count = int(box.commands.run("cat /tmp/counter").stdout.strip() or "0")
    return pid, count


def _assert_intact(box: Sandbox, pid: int, count: int) -> None:
    assert box.files.read("/home/user/note") == "written-on-a"
    assert box.commands.run(f"kill -0 {pid} && echo alive").stdout.strip() == "alive"
    time.sleep(0.6)
    now_pid, now = _counter(box)
    assert now_pid == pid and now > count, (pid, count, now_pid, now)


def _assert_sealed(etcd, sid: str, box: Sandbox) -> None:
    """Whoever reads etcd finds neither the sandbox's token, its env vars
    nor node A's address in the clear."""
    token = box._envd_access_token
    assert token
    for key in (f"/siesta/sandboxes/{sid}", "/siesta/nodes/a"):
        raw = etcd.get_raw(key)
        assert raw is not None and raw.startswith(b"siesta-sealed-v1:"), key
        for secret in (token.encode(), b"env-value-7f3a", b"CLUSTER_SECRET", b"127.0.0.1"):
            assert secret not in raw, f"{key} holds {secret!r} in the clear"


def _assert_checked_before_forwarding(b: SiestaServer, sid: str) -> None:
    """Through B, for a sandbox A holds: a control call without the API
    key and envd traffic without the sandbox's token get B's 401 (no
    `x-siesta-node`: nothing was forwarded) and wake nothing."""
    keyless = httpx.get(f"{b.url}/sandboxes/{sid}", timeout=30)
    assert keyless.status_code == 401, keyless.text
    assert "x-siesta-node" not in keyless.headers
    envd = httpx.get(
        f"{b.url}/health",
        headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"},
        timeout=30,
    )
    assert envd.status_code == 401, envd.text
    assert "x-siesta-node" not in envd.headers
    still = b.api("GET", f"/sandboxes/{sid}")
    assert still.status_code == 200 and still.json()["state"] == "paused", still.text
    assert still.headers.get("x-siesta-node") == "a"


def _wait(what: str, limit: float, check) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {limit} s"
        time.sleep(0.5)


def test_a_sandbox_moves_between_nodes(nodes, infra, monkeypatch):
    a, b = nodes
    etcd, _ = infra
    _point_sdk(monkeypatch, a)
    box = Sandbox.create(template="base", timeout=600, envs={"CLUSTER_SECRET": "env-value-7f3a"})
    sid = box.sandbox_id
    try:
        box.files.write("/home/user/note", "written-on-a")
        box.commands.run(
            "sh -c 'echo $$ > /tmp/counter.pid; i=0; "
            "while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done'",
            background=True,
        )
        # Known cluster-wide as soon as the create returned.
        seen = b.api("GET", f"/sandboxes/{sid}")
        assert seen.status_code == 200 and seen.headers.get("x-siesta-node") == "a"
        time.sleep(0.5)
        pid, count = _counter(box)
        assert box.pause() is True
        assert etcd.get(f"/siesta/owners/{sid}") == "a"
        _assert_sealed(etcd, sid, box)
        _assert_checked_before_forwarding(b, sid)

        # Through B: B forwards to A, which resumes it.
        _point_sdk(monkeypatch, b)
        same = Sandbox.connect(sid)
        _assert_intact(same, pid, count)
        seen = b.api("GET", f"/sandboxes/{sid}")
        assert seen.status_code == 200 and seen.headers.get("x-siesta-node") == "a"
        # Lists show the cluster's sandboxes, on any node.
        assert sid in {s.sandbox_id for s in Sandbox.list().next_items()}
        listed = b.api("GET", "/v2/sandboxes?state=running").json()
        assert sid in {s["sandboxID"] for s in listed}
        assert etcd.get(f"/siesta/owners/{sid}") == "a"
        _, count = _counter(same)

        # Paused again (through B), and its pause shared through the store.
        assert same.pause() is True
        _wait("the pause to reach the object store", 180,
              lambda: etcd.get(f"/siesta/stored/{sid}") is not None)

        # A dies; after its lease B takes the sandbox over on the next call.
        a.kill9()
        _wait("a's lease to expire", 30, lambda: etcd.get("/siesta/nodes/a") is None)
        # Listed as paused (its pause can move) while its node is dead.
        paused = b.api("GET", "/v2/sandboxes?state=paused").json()
        assert sid in {s["sandboxID"] for s in paused}
        moved = Sandbox.connect(sid)
        assert etcd.get(f"/siesta/owners/{sid}") == "b"
        _assert_intact(moved, pid, count)
        here = b.api("GET", f"/sandboxes/{sid}")
        assert here.status_code == 200 and "x-siesta-node" not in here.headers
        assert sid in {s["sandboxID"] for s in b.api("GET", "/v2/sandboxes").json()}

        # A comes back: its stale copy is dropped, and it forwards to B.
        a.start()
        via_a = a.api("GET", f"/sandboxes/{sid}")
        assert via_a.status_code == 200, via_a.text
        assert via_a.headers.get("x-siesta-node") == "b"
        assert sid in {s["sandboxID"] for s in a.api("GET", "/v2/sandboxes").json()}
    finally:
        killed = b.api("DELETE", f"/sandboxes/{sid}")
        print(f"kill {sid} through b: {killed.status_code} {killed.text}")
    assert etcd.get(f"/siesta/owners/{sid}") is None


def test_a_node_stopped_cleanly_hands_its_sandboxes_over(nodes, infra, monkeypatch):
    """SIGTERM to a node in a cluster pauses its sandboxes, waits for the
    pauses to reach the object store and leaves: another node takes them
    over at once (no lease to wait for)."""
    a, b = nodes
    etcd, _ = infra
    if a.proc is None:
        a.start()
    _point_sdk(monkeypatch, a)
    box = Sandbox.create(template="base", timeout=600)
    sid = box.sandbox_id
    try:
        box.files.write("/home/user/note", "written-on-a")
        a.stop()
        assert etcd.get("/siesta/nodes/a") is None, "a left the cluster"
        assert etcd.get(f"/siesta/stored/{sid}") is not None, "its pause is in the store"
        _point_sdk(monkeypatch, b)
        moved = Sandbox.connect(sid)
        assert etcd.get(f"/siesta/owners/{sid}") == "b"
        assert moved.files.read("/home/user/note") == "written-on-a"
    finally:
        killed = b.api("DELETE", f"/sandboxes/{sid}")
        print(f"kill {sid} through b: {killed.status_code} {killed.text}")


def test_a_node_without_etcd_says_so(cluster_key):
    """A node given an etcd that does not answer refuses to start, saying
    which endpoints it tried, rather than running outside its cluster."""
    import subprocess

    home = _prepare_home()
    tag = net_tag("ce")
    env = {"SIESTA_HOME": str(home), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
           "SIESTA_NET_TAG": tag, "SIESTA_NET_SUBNET": net_subnet(185, 5),
           "SIESTA_CLUSTER_KEY_FILE": str(cluster_key)}

    def serve(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BINARY), "serve", "--listen", "127.0.0.1:1", "--etcd", "http://127.0.0.1:9",
             *extra],
            env=env, capture_output=True, text=True, timeout=120,
        )

    try:
        done = serve("--insecure-etcd")
        # Plain HTTP without saying so is refused before anything is tried.
        plain = serve()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode != 0
    assert "joining the cluster at http://127.0.0.1:9" in done.stderr, done.stderr
    assert "no etcd member answered" in done.stderr, done.stderr
    assert plain.returncode != 0
    assert "--insecure-etcd" in plain.stderr, plain.stderr
    assert not netns_of(tag)
