"""OCI images for tests, made without Docker, and a real registry to serve them.

`layout_from_tree_tar` writes an OCI image layout whose one layer is an
existing root-filesystem tarball (the debootstrap tree `make assets` caches),
so tests get a Debian image with bash, python3 and coreutils without any
download. `Registry` runs Debian's `docker-registry` on 127.0.0.1 with its
own configuration and stops it by pid. `push` copies a layout into it with
skopeo. The tools come from scripts/install-test-deps.sh.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def _file_blob(layout: Path, path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    dest = layout / "blobs" / "sha256" / digest
    try:
        os.link(path, dest)
    except OSError:
        shutil.copyfile(path, dest)
    return f"sha256:{digest}", path.stat().st_size


def layout_from_tree_tar(tree_tar: Path, layout: Path, tag: str, config: dict) -> Path:
    """An OCI layout at `layout` holding image `tag`: one uncompressed layer
    (`tree_tar`) and `config` as the image's run config (Env, WorkingDir...)."""
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    layer, layer_size = _file_blob(layout, tree_tar)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer]},
    }
    cfg, cfg_size = _blob(layout, json.dumps(image_config).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg, "size": cfg_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": layer_size}],
    }
    man, man_size = _blob(layout, json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": man,
            "size": man_size,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    }
    (layout / "index.json").write_text(json.dumps(index))
    return layout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`docker-registry serve` on 127.0.0.1:PORT, data under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Registry":
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log: {level: error, accesslog: {disabled: true}}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.root / 'data'}}}, delete: {{enabled: true}}}}\n"
            f"http: {{addr: 127.0.0.1:{self.port}, secret: siesta-test}}\n"
        )
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("docker-registry did not start")

    def name(self, repo: str) -> str:
        return f"127.0.0.1:{self.port}/{repo}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def push(layout: Path, tag: str, dest: str) -> None:
    """skopeo copy oci:LAYOUT:TAG docker://DEST over plain HTTP."""
    subprocess.run(
        ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{dest}"],
        check=True,
        timeout=600,
    )


def tree_tar(home: Path) -> Path | None:
    """The debootstrap tree tarball guest/build-rootfs.sh caches."""
    found = sorted((home / "cache").glob("debootstrap-*.tar"))
    return found[-1] if found else None
