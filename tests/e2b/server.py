"""A real `siesta serve` for the E2B SDK tests: its own SIESTA_HOME, network
tag and subnet, started and stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
REAL_HOME = Path(os.environ.get("SIESTA_HOME", "/var/lib/siesta"))
BINARY = Path(os.environ.get("SIESTA_BIN", ROOT / "target/release/siesta"))


# What test servers open to API image builds: their registries' loopback
# address, nothing more.
REGISTRY_PRIVATE_ALLOW = "127.0.0.1/32"


class SetupError(RuntimeError):
    """The machine is not ready for a real server: what to run is in the
    message."""


def prepare_home(prefix: str) -> Path:
    """A temporary SIESTA_HOME under /var/tmp: `assets` linked to the real
    home's, and the real `base` template shared into its repository when
    there is one (else `build_base` builds it there)."""
    assets = REAL_HOME / "assets"
    if not (assets / "vmlinuz").exists():
        raise SetupError(f"no guest assets in {assets}: run `make assets`")
    if not BINARY.exists():
        raise SetupError(f"{BINARY} missing: run `make build`")
    home = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    (home / "assets").symlink_to(assets)
    share_template(REAL_HOME / "repo", home / "repo", "base")
    return home


def share_template(real: Path, repo: Path, name: str) -> None:
    """Puts template `name` of the real repository into the test home's, so
    a run does not build it again. Its blobs are immutable and
    content-addressed, so they are hard-linked (copied across file systems);
    the snapshot directory is copied: the real template may be rebuilt or
    deleted while we run, and a paused sandbox must find what it was born
    from."""
    alias = real / "aliases" / f"template:{name}"
    if not alias.is_file():
        return
    snap_id = alias.read_text().strip()
    source = real / "snapshots" / snap_id
    record = json.loads((source / "record.json").read_text())
    for sub in ("aliases", "blobs", "snapshots"):
        (repo / sub).mkdir(parents=True, exist_ok=True)
    for f in record["files"].values():
        if f["in"] != "blob":
            continue
        src, dst = real / "blobs" / f["sha256"], repo / "blobs" / f["sha256"]
        try:
            os.link(src, dst)
        except OSError:
            subprocess.run(["cp", "--sparse=always", str(src), str(dst)], check=True)
    subprocess.run(["cp", "-a", str(source), str(repo / "snapshots" / snap_id)], check=True)
    (repo / "aliases" / f"template:{name}").write_text(snap_id)


def build_base(home: Path, log: Path) -> None:
    """`siesta template build base --if-missing` in `home`."""
    env = dict(os.environ, SIESTA_HOME=str(home))
    with open(log, "ab") as out:
        out.write(b"=== siesta template build base --if-missing ===\n")
        out.flush()
        done = subprocess.run(
            [str(BINARY), "template", "build", "base", "--if-missing"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            timeout=900, check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise SetupError(f"building the base template failed:\n{tail}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def net_tag(prefix: str = "py") -> str:
    """A network tag of 1..6 lowercase letters, unique per test run; a
    second server in the same run needs another `prefix` (a server starting
    removes whatever network namespaces of its tag it finds)."""
    n = os.getpid()
    letters = ""
    for _ in range(4):
        letters += chr(ord("a") + n % 26)
        n //= 26
    return prefix + letters


def net_subnet(base: int = 200, span: int = 40) -> str:
    """A /16 for this run's slots, away from the default 10.250.0.0/16; a
    second server in the same run needs another range (`base`, `span`)."""
    return f"10.{base + os.getpid() % span}.0.0/16"


def netns_of(tag: str) -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    return [
        line.split()[0]
        for line in out.splitlines()
        if line.split() and line.split()[0].startswith(f"siesta-{tag}-")
    ]


def remove_cgroups(tag: str) -> None:
    """The VMM cgroups of the server with `tag` (`siesta-<tag>/<vm>.<n>`,
    docs/security.md), which a killed server leaves behind: removed by
    exact name, and only when empty (rmdir refuses a group in use)."""
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids",
                 "/sys/fs/cgroup/cpu"):
        parent = Path(root) / f"siesta-{tag}"
        if not parent.is_dir():
            continue
        for child in parent.iterdir():
            if child.is_dir():
                try:
                    child.rmdir()
                except OSError:
                    pass
        try:
            parent.rmdir()
        except OSError:
            pass


def pids_using(path: Path) -> list[int]:
    """Processes whose command line names `path` (VMMs of this home)."""
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class SiestaServer:
    def __init__(self, binary: Path, home: Path, log: Path, second: bool = False):
        """`second`: a server beside the session's, with its own network
        tag and subnet (never the session server's slots)."""
        self.binary = binary
        self.home = home
        self.log_path = log
        self.port = free_port()
        self.tag = net_tag("pc" if second else "py")
        self.subnet = net_subnet(240, 10) if second else net_subnet()
        # Where the egress proxy asks for allowed domains' addresses: a DNS
        # server a test starts there (dns_answer.py) when it needs one.
        self.egress_dns_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"
        # More of the server's environment (a cluster test's etcd and S3).
        self.extra_env: dict[str, str] = {}

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SIESTA_HOME=str(self.home),
            SIESTA_NET_TAG=self.tag,
            SIESTA_NET_SUBNET=self.subnet,
            SIESTA_EGRESS_DNS=f"127.0.0.1:{self.egress_dns_port}",
            # The tests' registries (docker-registry, hostile ones) listen on
            # 127.0.0.1, which image builds asked for through the API reach
            # only when opened (docs/security.md, M7).
            SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW=REGISTRY_PRIVATE_ALLOW,
            RUST_LOG=os.environ.get("RUST_LOG", "info"),
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 180, listen_flag: bool = True) -> None:
        """Starts `siesta serve`; without `listen_flag` the address comes
        from the home's siesta.toml, which must name this server's port."""
        log = open(self.log_path, "ab")
        log.write(f"\n=== siesta serve on {self.url} ===\n".encode())
        log.flush()
        listen = ["--listen", f"127.0.0.1:{self.port}"] if listen_flag else []
        self.proc = subprocess.Popen(
            [str(self.binary), "serve", *listen],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"siesta serve exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"siesta serve not up after {timeout} s:\n{self.log_tail()}")

    def api_key(self) -> str:
        return (self.home / "secrets" / "api-key").read_text().strip()

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        """A raw control-API call with the node's key."""
        headers = {"X-API-KEY": self.api_key(), **kwargs.pop("headers", {})}
        kwargs.setdefault("timeout", 60)
        return httpx.request(method, f"{self.url}{path}", headers=headers, **kwargs)

    def stop(self, grace: float = 90) -> None:
        """SIGTERM (the server pauses its sandboxes), then SIGKILL by pid."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def stop_and_clean(self) -> list[str]:
        """`stop`, then SIGKILL any VMM naming the home (a crashed server's)
        and delete the network namespaces of the tag. Returns the
        namespaces that were left, which a clean stop never leaves."""
        self.stop()
        for pid in pids_using(self.home):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        leftovers = netns_of(self.tag)
        for ns in leftovers:
            subprocess.run(["ip", "netns", "delete", ns], check=False)
        remove_cgroups(self.tag)
        return leftovers

    def point_sdk_here(self) -> None:
        """Points the E2B SDK (its environment variables) at this server."""
        os.environ.pop("E2B_DEBUG", None)
        for var in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL"):
            os.environ[var] = self.url
        os.environ["E2B_API_KEY"] = self.api_key()

    def kill9(self) -> None:
        """Crashes the server: SIGKILL by pid, nothing is paused or cleaned."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
