#!/usr/bin/env python3
"""E2B's own Python SDK test suite against a real `siesta serve`.

The suite (e2b-dev/E2B's SDK integration tests, SDK 2.45.1) lives in
../shared/conformance beside the repository, with its runner
`run-e2b-python-sdk`. This script:

1. makes a temporary SIESTA_HOME (assets linked from the real home), builds
   the `base` template there, and starts `siesta serve` with its own port,
   network tag and subnet (tests/e2b/server.py);
2. runs the suite with the key the server minted, exactly as a user would:
   no E2B_VALIDATE_API_KEY or other override;
3. compares the failures with tests/conformance/expected-failures.txt: a
   failure not listed there fails this script; a listed test that passed
   is reported so the list can shrink;
4. stops the server by pid and removes its home and namespaces, also when
   the suite fails or the script is interrupted.

Usage: run.py [pytest args...]   (default: DEFAULT_SELECTION below)
Environment: SIESTA_BIN, SIESTA_HOME (the real home with assets),
SIESTA_CONFORMANCE_DIR (default ../shared/conformance),
SIESTA_CONFORMANCE_TIMEOUT (seconds for the whole suite, default 2400).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2b"))

from server import (  # noqa: E402
    BINARY,
    SetupError,
    SiestaServer,
    build_base,
    prepare_home as prepare_test_home,
)

SUITE = Path(os.environ.get("SIESTA_CONFORMANCE_DIR", ROOT.parent / "shared" / "conformance"))
TIMEOUT = int(os.environ.get("SIESTA_CONFORMANCE_TIMEOUT", "2400"))
EXPECTED = HERE / "expected-failures.txt"


def expected_failures() -> dict[str, str]:
    """Test id -> why it fails here (see the file's header)."""
    out = {}
    for line in EXPECTED.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test, _, why = line.partition(" ")
        out[test] = why.strip()
    return out


def test_id(classname: str, name: str) -> str:
    """pytest's id (path::[Class::]name) of a junit test case: the longest
    dotted prefix of the class name that is a file of the suite is the path."""
    parts = classname.split(".")
    root = SUITE / "e2b-python-sdk"
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[i:], name])
    return f"{'/'.join(parts)}.py::{name}"


def outcomes(junit: Path) -> dict[str, str]:
    """Test id (path::name as pytest prints it) -> passed|failed|skipped."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = test_id(case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            result[test] = "failed"
        elif case.find("skipped") is not None:
            result[test] = "skipped"
        else:
            result[test] = "passed"
    return result


def prepare_home() -> Path:
    try:
        return prepare_test_home("siesta-conformance-")
    except SetupError as e:
        sys.exit(str(e))


def build_template(home: Path, log: Path) -> None:
    try:
        build_base(home, log)
    except SetupError as e:
        sys.exit(str(e))


# What runs when no test path is given: the server-facing tests, sync and
# async halves (the suite's unit tests of the SDK's own URL handling assume
# E2B's domain and are not about the server).
DEFAULT_SELECTION = [
    f"tests/{mode}/{area}_{mode}"
    for mode in ("sync", "async")
    for area in ("sandbox", "api", "template", "volume")
]


def run_suite(server: SiestaServer, junit: Path, args: list[str]) -> int:
    runner = SUITE / "run-e2b-python-sdk"
    if not any(not a.startswith("-") for a in args):
        args = [*DEFAULT_SELECTION, *args]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for var in ("E2B_VALIDATE_API_KEY", "E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        env.pop(var, None)
    cmd = ["bash", str(runner), server.url, server.api_key(), *args, f"--junitxml={junit}"]
    try:
        return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, timeout=TIMEOUT).returncode
    except subprocess.TimeoutExpired:
        print(f"conformance: the suite ran past {TIMEOUT} s and was stopped", flush=True)
        return 124


def judge(junit: Path) -> int:
    if not junit.exists():
        print("conformance: the suite wrote no results (it did not run)")
        return 1
    seen = outcomes(junit)
    expected = expected_failures()
    failed = sorted(t for t, o in seen.items() if o == "failed")
    unexpected = [t for t in failed if t not in expected]
    now_passing = sorted(t for t in expected if seen.get(t) == "passed")
    counts = {o: sum(1 for v in seen.values() if v == o) for o in ("passed", "failed", "skipped")}
    print(f"\nconformance: {len(seen)} tests: {counts['passed']} passed, {counts['failed']} failed "
          f"({len(failed) - len(unexpected)} of them listed in {EXPECTED.name}), {counts['skipped']} skipped")
    for t in now_passing:
        print(f"conformance: listed as failing but passed now (remove it from the list): {t}")
    for t in unexpected:
        print(f"conformance: UNEXPECTED FAILURE {t}")
    return 1 if unexpected else 0


def main() -> int:
    runner = SUITE / "run-e2b-python-sdk"
    if not runner.exists():
        print(f"conformance: {runner} not found (set SIESTA_CONFORMANCE_DIR)")
        return 1
    # SIGTERM (CI stopping us) runs the cleanup below too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    home = prepare_home()
    log = home.parent / f"{home.name}.log"
    server = SiestaServer(BINARY, home, log)
    junit = home.parent / f"{home.name}.xml"
    try:
        build_template(home, log)
        server.start()
        run_suite(server, junit, sys.argv[1:])
        return judge(junit)
    finally:
        server.stop_and_clean()
        print(f"conformance: server log {log} (last lines):\n{server.log_tail(15)}")
        if os.environ.get("SIESTA_CONFORMANCE_KEEP") != "1":
            shutil.rmtree(home, ignore_errors=True)
            junit.unlink(missing_ok=True)
            log.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
