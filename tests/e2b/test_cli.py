"""`siesta sandbox ...` against the live server: the CLI goes through the
API and, for exec, the front door, as a user's shell would (SIESTA_URL,
SIESTA_API_KEY)."""

import json
import os
import subprocess

from conftest import BINARY


def cli(siesta, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SIESTA_URL=siesta.url, SIESTA_API_KEY=siesta.api_key())
    return subprocess.run(
        [str(BINARY), "sandbox", *args], env=env, capture_output=True, text=True, timeout=300
    )


def ok(siesta, *args: str) -> str:
    out = cli(siesta, *args)
    assert out.returncode == 0, f"siesta sandbox {' '.join(args)}: {out.stderr}"
    return out.stdout


def test_create_snapshot_fork_list_kill(siesta):
    source = ok(siesta, "create", "--template", "base").strip()
    made = [source]
    try:
        ok(siesta, "exec", "--shell", source, "--", "echo from-cli > /tmp/mark")
        # Without --shell the words are the program's argv, not re-joined.
        assert ok(siesta, "exec", source, "--", "printf", "%s|", "a b", "c") == "a b|c|"
        snap = ok(siesta, "snapshot", source).strip()
        assert snap
        from_snap = ok(siesta, "create", "--template", snap).strip()
        made.append(from_snap)
        assert ok(siesta, "exec", from_snap, "--", "cat", "/tmp/mark") == "from-cli\n"
        children = ok(siesta, "fork", source, "--count", "2").split()
        made += children
        assert len(set(children)) == 2 and source not in children
        for child in children:
            assert ok(siesta, "exec", child, "--", "cat", "/tmp/mark") == "from-cli\n"
        listed = {s["sandboxID"]: s["state"] for s in json.loads(ok(siesta, "list", "--json"))}
        for sid in made:
            assert listed.get(sid) == "running", (sid, listed)
    finally:
        for sid in made:
            cli(siesta, "kill", sid)
    # E2B deletes a snapshot as a template.
    assert siesta.api("DELETE", f"/templates/{snap}").status_code < 300


def test_exec_exit_code_and_stderr(siesta):
    box = ok(siesta, "create").strip()
    try:
        out = cli(siesta, "exec", "--shell", box, "--", "echo oops >&2; exit 7")
        assert out.returncode == 7
        assert out.stderr == "oops\n"
        out = cli(siesta, "exec", box, "--", "/no/such/program")
        assert out.returncode != 0
        assert "no/such/program" in out.stderr, out.stderr
    finally:
        cli(siesta, "kill", box)


def files(siesta, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SIESTA_URL=siesta.url, SIESTA_API_KEY=siesta.api_key())
    return subprocess.run(
        [str(BINARY), "files", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_files_cp_both_ways_and_ls(siesta, tmp_path):
    box = ok(siesta, "create").strip()
    try:
        local = tmp_path / "in.bin"
        local.write_bytes(bytes(range(256)) * 1000)
        out = files(siesta, "cp", str(local), f"{box}:/home/user/data/in.bin")
        assert out.returncode == 0, out.stderr
        assert ok(siesta, "exec", box, "--", "stat", "-c", "%s %U", "/home/user/data/in.bin") == (
            "256000 user\n"
        )
        back = tmp_path / "back.bin"
        out = files(siesta, "cp", f"{box}:/home/user/data/in.bin", str(back))
        assert out.returncode == 0, out.stderr
        assert back.read_bytes() == local.read_bytes()
        out = files(siesta, "ls", box, "/home/user/data", "--json")
        assert out.returncode == 0, out.stderr
        assert [e["name"] for e in json.loads(out.stdout)] == ["in.bin"]
        out = files(siesta, "ls", box, "/home/user/data")
        assert "in.bin" in out.stdout and "256000" in out.stdout, out.stdout
        out = files(siesta, "cp", f"{box}:/no/such/file", str(tmp_path / "x"))
        assert out.returncode != 0 and "404" in out.stderr, out.stderr
        assert not (tmp_path / "x").exists()
        out = files(siesta, "cp", str(local), str(back))
        assert out.returncode != 0 and "ID:PATH" in out.stderr
    finally:
        cli(siesta, "kill", box)


def test_fork_of_a_missing_sandbox_says_so(siesta):
    out = cli(siesta, "fork", "nosuchsandbox", "--count", "2")
    assert out.returncode != 0
    assert "404" in out.stderr or "not found" in out.stderr.lower(), out.stderr
