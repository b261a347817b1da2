"""Installing packages in `base` as an agent does, as `user` (issue 39 item 5).

Debian's Python is "externally managed" (PEP 668) and its pip refuses to
install, which is the first thing an agent's code runs into. The packages
are built here and installed offline (`--no-index`, `--offline`): what is
checked is that pip and npm install for `user`, not that the guest reaches
a registry.
"""

import io
import json
import tarfile
import zipfile

WHEEL = "siesta_probe-1.0-py3-none-any.whl"
TARBALL = "siesta-probe-1.0.0.tgz"


def probe_wheel() -> bytes:
    """A pure-Python wheel holding `siesta_probe.ANSWER = 42`."""
    info = "siesta_probe-1.0.dist-info"
    files = {
        "siesta_probe/__init__.py": "ANSWER = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: siesta-probe\nVersion: 1.0\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: siesta-test\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", record)
    return buf.getvalue()


def probe_tarball() -> bytes:
    """An npm package (as `npm pack` lays it out) with a `siesta-probe` bin."""
    files = {
        "package/package.json": (
            json.dumps(
                {
                    "name": "siesta-probe",
                    "version": "1.0.0",
                    "bin": {"siesta-probe": "cli.js"},
                }
            ),
            0o644,
        ),
        "package/cli.js": ("#!/usr/bin/env node\nconsole.log('probe ran');\n", 0o755),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, (text, mode) in files.items():
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), mode
            tar.addfile(member, io.BytesIO(data))
    return buf.getvalue()


def test_pip_installs_for_user(sbx):
    sbx.files.write(f"/home/user/{WHEEL}", probe_wheel())
    r = sbx.commands.run(
        f"pip install --no-index --no-deps /home/user/{WHEEL} 2>&1",
        timeout=300,
    )
    assert "externally-managed-environment" not in r.stdout, r.stdout
    assert "Successfully installed siesta-probe-1.0" in r.stdout, r.stdout
    r = sbx.commands.run("python3 -c 'import siesta_probe; print(siesta_probe.ANSWER)'")
    assert r.stdout == "42\n"
    # A user install: into the user's site, not the system's.
    r = sbx.commands.run("python3 -c 'import siesta_probe; print(siesta_probe.__file__)'")
    assert r.stdout.startswith("/home/user/.local/lib/python3"), r.stdout


def test_npm_installs_globally_for_user(sbx):
    sbx.files.write(f"/home/user/{TARBALL}", probe_tarball())
    r = sbx.commands.run(
        f"npm install -g --offline --no-audit --no-fund /home/user/{TARBALL} 2>&1",
        timeout=300,
    )
    assert "EACCES" not in r.stdout, r.stdout
    # Its command is on the login shell's PATH for the next command.
    r = sbx.commands.run("command -v siesta-probe && siesta-probe", timeout=120)
    assert r.stdout == "/home/user/.local/bin/siesta-probe\nprobe ran\n", r.stdout
