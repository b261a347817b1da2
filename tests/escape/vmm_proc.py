"""Finding a sandbox's QEMU process and what it holds, from /proc."""

from __future__ import annotations

import os
from pathlib import Path


def find_qemu(vm_name: str) -> int | None:
    """The pid of the QEMU whose `-name guest=<vm_name>`, if one runs."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and f"guest={vm_name}".encode() in argv:
            return int(entry.name)
    return None


def qemu_of(sandbox_id: str) -> int:
    """The pid of the QEMU started for the sandbox."""
    pid = find_qemu(sandbox_id)
    if pid is None:
        raise AssertionError(f"no QEMU process for sandbox {sandbox_id}")
    return pid


def status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def open_files(pid: int, suffix: str = "") -> list[Path]:
    """Files process `pid` holds open whose names end in `suffix`."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith(suffix):
            found.append(Path(target))
    return found


def qemu_holding(path: Path) -> int:
    """The pid of the QEMU that holds `path` open (a resumed sandbox's VMM
    may have been started for the pool under another name)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "exe").resolve().name.startswith("qemu-system"):
                continue
            if path in open_files(int(entry.name)):
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no QEMU holds {path} open")
