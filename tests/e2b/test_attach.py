"""`siesta sandbox attach ID` against the live server: an interactive shell
in a pty in the sandbox, driven here from a real local pseudo-terminal (raw
mode, keystrokes, Ctrl-C, a resize with SIGWINCH, the exit code), from a
pipe (no terminal), and refused for a missing or paused sandbox."""

import fcntl
import os
import re
import signal
import struct
import subprocess
import termios
import threading
import time

import pytest

from conftest import BINARY


def cli_env(siesta) -> dict[str, str]:
    return dict(os.environ, SIESTA_URL=siesta.url, SIESTA_API_KEY=siesta.api_key())


def cli(siesta, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BINARY), "sandbox", *args],
        env=cli_env(siesta),
        capture_output=True,
        timeout=300,
        **kwargs,
    )


@pytest.fixture(scope="module")
def box(siesta):
    out = cli(siesta, "create", "--template", "base")
    assert out.returncode == 0, out.stderr
    sid = out.stdout.decode().strip()
    try:
        yield sid
    finally:
        cli(siesta, "kill", sid)


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """`siesta sandbox attach` with a pseudo-terminal as its stdin, stdout
    and stderr; everything it prints is collected by a thread."""

    def __init__(self, siesta, sid: str, rows: int, cols: int):
        self.master, self.slave = os.openpty()
        set_size(self.master, rows, cols)
        self.before = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            [str(BINARY), "sandbox", "attach", sid],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env=cli_env(siesta),
            start_new_session=True,
        )
        self.output = b""
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: every holder of the slave side closed it
                return
            if not chunk:
                return
            with self.lock:
                self.output += chunk

    def text(self) -> str:
        with self.lock:
            return self.output.decode(errors="replace")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def wait_for(self, pattern: str, timeout: float = 60, since: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.text()[since:]):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in the output: {self.text()!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.slave)
        self.reader.join(timeout=10)
        os.close(self.master)


def test_attach_in_a_terminal(siesta, box):
    term = Terminal(siesta, box, rows=33, cols=101)
    try:
        # The prompt of the remote login shell.
        term.wait_for(r"[$#] ")
        # Raw mode: Enter is a carriage return, as a real keyboard sends.
        term.type("echo attach-$((6*7))\r")
        term.wait_for(r"attach-42")
        term.type("stty size\r")
        term.wait_for(r"\b33 101\b")

        # Ctrl-C reaches the remote shell (interrupts its sleep) and leaves
        # the local command running.
        term.type("sleep 60\r")
        time.sleep(1)
        term.type("\x03")
        term.type("echo after-int-$((1+1))\r")
        term.wait_for(r"after-int-2", timeout=20)
        assert term.proc.poll() is None

        # A resize: the new size, then SIGWINCH, as a terminal emulator does.
        set_size(term.master, 40, 120)
        term.proc.send_signal(signal.SIGWINCH)
        for _ in range(20):
            mark = len(term.text())
            term.type("stty size\r")
            try:
                term.wait_for(r"\b40 120\b", timeout=1.5, since=mark)
                break
            except AssertionError:
                continue
        else:
            raise AssertionError(f"the size never changed: {term.text()!r}")

        term.type("exit 3\r")
        assert term.proc.wait(timeout=60) == 3, term.text()
        # The local terminal is as it was before (raw mode undone).
        assert termios.tcgetattr(term.slave) == term.before
    finally:
        term.close()


def test_attach_with_piped_input(siesta, box):
    out = cli(siesta, "attach", box, input=b"echo piped-ok\nexit\n")
    assert out.returncode == 0, out.stderr
    lines = [line.strip() for line in out.stdout.decode(errors="replace").splitlines()]
    assert "piped-ok" in lines, out.stdout
    # Input without `exit`: the end of the input ends the shell (Ctrl-D),
    # with the last command's code.
    out = cli(siesta, "attach", box, input=b"echo no-exit-$((2+3))\nfalse\n")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert b"no-exit-5" in out.stdout


def test_attach_refuses_a_missing_or_paused_sandbox(siesta):
    out = cli(siesta, "attach", "nosuchsandbox", input=b"")
    assert out.returncode != 0
    assert b"nosuchsandbox" in out.stderr, out.stderr

    made = cli(siesta, "create", "--template", "base")
    assert made.returncode == 0, made.stderr
    sid = made.stdout.decode().strip()
    try:
        paused = cli(siesta, "pause", sid)
        assert paused.returncode == 0, paused.stderr
        out = cli(siesta, "attach", sid, input=b"")
        assert out.returncode != 0
        assert f"siesta sandbox resume {sid}".encode() in out.stderr, out.stderr
    finally:
        cli(siesta, "kill", sid)
