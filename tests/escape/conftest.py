"""The escape suite (issue 40): attacks tried from inside real guests, and
from hostile inputs, against a real `siesta serve`; every one must fail.

One server for the session, as in tests/e2b and tests/faults (its own
SIESTA_HOME under /var/tmp with the real `base` template shared in, its
own network tag and subnet). Each test records the attacks it tried with
the `attack` fixture; the summary says how many were tried and that none
got through (a test whose attack got through fails on its own assert).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "e2b"))

from server import (  # noqa: E402
    BINARY,
    SetupError,
    SiestaServer,
    build_base,
    prepare_home,
)

# (test, attack, got through)
ATTEMPTS: list[tuple[str, str, bool]] = []


@pytest.fixture(scope="session")
def siesta(tmp_path_factory):
    try:
        home = prepare_home("siesta-escape-")
    except SetupError as e:
        pytest.exit(str(e), returncode=3)
    log = tmp_path_factory.mktemp("logs") / "siesta.log"
    server = SiestaServer(BINARY, home, log)
    leftovers: list[str] = []
    try:
        try:
            build_base(home, log)
        except SetupError as e:
            pytest.exit(str(e), returncode=3)
        server.start()
        server.point_sdk_here()
        yield server
    finally:
        leftovers = server.stop_and_clean()
        print(f"\nsiesta log: {log}\n{server.log_tail(30)}")
        if os.environ.get("SIESTA_E2B_KEEP") != "1":
            shutil.rmtree(home, ignore_errors=True)
    assert not leftovers, f"network namespaces left by the server: {leftovers}"


@pytest.fixture()
def attack(request):
    """`attack(name, got_through)`: records one attack and its outcome."""

    def record(name: str, got_through: bool) -> None:
        ATTEMPTS.append((request.node.name, name, got_through))

    return record


def pytest_terminal_summary(terminalreporter):
    through = [f"{t}: {a}" for t, a, got in ATTEMPTS if got]
    terminalreporter.write_sep("=", "escape suite")
    for line in through:
        terminalreporter.write_line(f"GOT THROUGH: {line}")
    verdict = "none got through" if not through else f"{len(through)} got through"
    terminalreporter.write_line(f"escape: {len(ATTEMPTS)} attacks tried, {verdict}")
