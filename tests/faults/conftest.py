"""The fault suite (issue 14): a real `siesta serve` killed with SIGKILL at
seeded points during its operations, and faults below it (its VMMs killed
or stopped, files corrupted, the disk full).

One server for the session, as in tests/e2b (its own SIESTA_HOME under
/var/tmp with the real `base` template shared in, its own network tag and
subnet); `SIESTA_FAULT_SEED` repeats a run's points, `SIESTA_FAULT_SCALE`
scales their number. The last test stops the server and checks that
nothing is left: no VMM, namespace, sandbox directory or repository issue.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "e2b"))

from points import kill_points, seed  # noqa: E402
from server import (  # noqa: E402
    BINARY,
    SetupError,
    SiestaServer,
    build_base,
    prepare_home,
)

SEED = seed()
SCALE = float(os.environ.get("SIESTA_FAULT_SCALE", "1"))
POINTS = kill_points(SEED, SCALE)
_outcomes: dict[str, list[str]] = {"kill": [], "hangup": [], "other": []}
# op -> [kills that cut the call short, kills after it had answered]
KILL_TIMING: dict[str, list[int]] = {}


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    """The session's server, with the E2B SDK pointed at it."""
    try:
        home = prepare_home("siesta-faults-")
    except SetupError as e:
        pytest.exit(str(e), returncode=3)
    log = tmp_path_factory.mktemp("faults") / "siesta.log"
    server = SiestaServer(BINARY, home, log)
    try:
        try:
            build_base(home, log)
        except SetupError as e:
            pytest.exit(str(e), returncode=3)
        server.start()
        server.point_sdk_here()
        yield server
    finally:
        server.stop_and_clean()
        print(f"\nsiesta log: {log}\n{server.log_tail(30)}")
        if os.environ.get("SIESTA_FAULT_KEEP") != "1":
            shutil.rmtree(home, ignore_errors=True)


def pytest_report_header(config):
    return (f"fault suite: seed {SEED} (SIESTA_FAULT_SEED={SEED} repeats it), "
            f"{len(POINTS)} kill points")


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if "test_kill_point[" in report.nodeid:
            kind = "kill"
        elif "test_hang_up[" in report.nodeid:
            kind = "hangup"
        else:
            kind = "other"
        _outcomes[kind].append(report.outcome)


def pytest_terminal_summary(terminalreporter):
    kill, hangup, other = _outcomes["kill"], _outcomes["hangup"], _outcomes["other"]
    terminalreporter.write_line(
        f"fault suite (seed {SEED}): {len(kill)} kill points tried: "
        f"{kill.count('passed')} passed, {kill.count('failed')} failed; "
        f"{len(hangup)} client hang-ups: {hangup.count('passed')} passed, "
        f"{hangup.count('failed')} failed; "
        f"other faults: {other.count('passed')} passed, {other.count('failed')} failed"
    )
    if KILL_TIMING:
        terminalreporter.write_line("kills per operation (during the call / after it answered): " + ", ".join(
            f"{op} {cut}/{after}" for op, (cut, after) in sorted(KILL_TIMING.items())))
