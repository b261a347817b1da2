"""A guest that took over its QEMU rewrites its disk's qcow2 header.

A VMM holds its sandbox's disk read-write, so a QEMU taken over can write
anything into the image, header included: a backing file name pointing at a
host file, or an external data file (a second file QEMU opens read-write
beside the image). The next resume opens that disk as root (the server, and
QEMU before it drops to its user). The test plays the compromised VMM: while
the sandbox runs, it rewrites the header of the very file QEMU has open,
then pauses and resumes the sandbox. A header's names must never be
followed: the resumed VMM holds the template's disk, never the file the
header names, and an image asking for a data file is refused with a clear
error while the sandbox stays paused.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from e2b import Sandbox
from vmm_proc import open_files, qemu_holding, qemu_of

DATA_FILE_EXT = 0x44415441  # "DATA": the external data file's name
EXTERNAL_DATA_FILE = 1 << 2  # incompatible feature bit


def _extensions(h: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    """A version 3 header's length and its extensions (up to the end marker)."""
    assert h[:4] == b"QFI\xfb" and struct.unpack(">I", h[4:8])[0] == 3
    at = header_len = struct.unpack(">I", h[100:104])[0]
    exts = []
    while True:
        kind, length = struct.unpack(">II", h[at : at + 8])
        if kind == 0:
            return header_len, exts
        exts.append((kind, h[at + 8 : at + 8 + length]))
        at += 8 + (length + 7) // 8 * 8


def _backing_name(path: Path) -> bytes:
    h = path.read_bytes()[:65536]
    offset, length = struct.unpack(">QI", h[8:20])
    return h[offset : offset + length]


def rewrite_header(path: Path, *, backing: bytes | None = None, data_file: bytes | None = None) -> None:
    """Rewrites qcow2 `path` in place as a VMM could: its backing file name,
    and/or an external data file (the feature bit and the name's extension).
    Everything is written within the first cluster, which holds only the
    header."""
    with open(path, "r+b") as f:
        h = f.read(65536)
        cluster = 1 << struct.unpack(">I", h[20:24])[0]
        header_len, exts = _extensions(h)
        offset, length = struct.unpack(">QI", h[8:20])
        name = h[offset : offset + length] if backing is None else backing
        if data_file is not None:
            exts = [e for e in exts if e[0] != DATA_FILE_EXT] + [(DATA_FILE_EXT, data_file)]
        body = b"".join(
            struct.pack(">II", kind, len(data)) + data + b"\0" * (-len(data) % 8) for kind, data in exts
        ) + struct.pack(">II", 0, 0)
        name_at = header_len + len(body)
        assert name_at + len(name) <= cluster, "the header does not fit its cluster"
        features = struct.unpack(">Q", h[72:80])[0]
        if data_file is not None:
            features |= EXTERNAL_DATA_FILE
        f.seek(8)
        f.write(struct.pack(">QI", name_at, len(name)))
        f.seek(72)
        f.write(struct.pack(">Q", features))
        f.seek(header_len)
        f.write(body + name)
        f.flush()
        os.fsync(f.fileno())


def _disk_of(pid: int) -> Path:
    disks = open_files(pid, "disk.qcow2")
    assert disks, f"QEMU {pid} holds no sandbox disk open"
    return disks[0]


def _file_with_inode(root: Path, inode: int) -> Path:
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            try:
                if p.stat().st_ino == inode:
                    return p
            except OSError:
                continue
    raise AssertionError(f"no file with inode {inode} under {root}")


def _tamper_then_pause(siesta, sb: Sandbox, **rewrite) -> tuple[Path, Path]:
    """Leaves a marker in the guest, rewrites (as its VMM could) the header
    of the disk its QEMU holds, and pauses it. Returns the disk's path and
    the paused snapshot's file of that disk."""
    sb.files.write("/home/user/marker", "kept")
    sb.commands.run("sync")
    disk = _disk_of(qemu_of(sb.sandbox_id))
    rewrite_header(disk, **rewrite)
    inode = disk.stat().st_ino
    assert sb.pause() is True
    return disk, _file_with_inode(siesta.home, inode)


def _canary(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    p.write_bytes(b"CANARY--" * (1 << 17))  # 1 MiB
    return p


def test_a_backing_name_the_vmm_wrote_is_not_followed(siesta, attack, tmp_path):
    canary = _canary(tmp_path, "host-secret.raw")
    before = canary.read_bytes()
    sb = Sandbox.create("base", timeout=300)
    try:
        disk, paused = _tamper_then_pause(siesta, sb, backing=str(canary).encode())
        assert _backing_name(paused) == str(canary).encode(), "the pause rewrote the header"

        resumed = Sandbox.connect(sb.sandbox_id)
        pid = qemu_holding(disk)
        held = open_files(pid)
        attack("a resume follows a backing name the VMM wrote", canary in held)
        assert canary not in held, held
        # The disk reads as before: the marker, and the template's files below it.
        assert resumed.files.read("/home/user/marker") == "kept"
        assert resumed.commands.run("cat /etc/os-release").exit_code == 0
        assert canary.read_bytes() == before
    finally:
        sb.kill()


def test_an_external_data_file_the_vmm_asked_for_is_refused(siesta, attack, tmp_path):
    canary = _canary(tmp_path, "host-file.raw")
    before = canary.read_bytes()
    sb = Sandbox.create("base", timeout=300)
    try:
        _, paused = _tamper_then_pause(siesta, sb, data_file=str(canary).encode())
        features = struct.unpack(">Q", paused.read_bytes()[72:80])[0]
        assert features & EXTERNAL_DATA_FILE, "the pause rewrote the header"

        r = siesta.api("POST", f"/sandboxes/{sb.sandbox_id}/resume", json={"timeout": 60})
        print(f"resume of a disk asking for a data file: {r.status_code} {r.text}")
        attack("a resume opens a data file the VMM named", r.is_success)
        assert not r.is_success
        assert "external data file" in r.text, r.text
        assert canary.read_bytes() == before
        # Nothing lost: the sandbox is still there, paused, its disk kept.
        info = siesta.api("GET", f"/sandboxes/{sb.sandbox_id}")
        assert info.status_code == 200 and info.json()["state"] == "paused", info.text
        assert paused.exists()
    finally:
        sb.kill()
