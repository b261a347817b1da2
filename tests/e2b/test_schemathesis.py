"""Hostile input for the control API (issue 12): schemathesis generates
requests from docs/openapi.yaml (and malformed variants of them) against a
real server; no answer may be a 5xx, and the server must still answer
afterwards. Bounded: a fixed number of examples per operation and a fixed
seed, so a run is reproducible. Operations that would start VMs or builds
at random are left out (their inputs are covered by test_malformed.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
EXAMPLES = int(os.environ.get("SIESTA_SCHEMATHESIS_EXAMPLES", "25"))


def _schemathesis() -> str:
    path = os.environ.get("SCHEMATHESIS_BIN") or shutil.which("schemathesis")
    if not path:
        pytest.fail("schemathesis is missing: `make schemathesis-venv` installs it")
    return path


def test_no_generated_request_gets_a_server_error(siesta, tmp_path):
    cmd = [
        _schemathesis(), "run", str(SCHEMA),
        "--url", siesta.url,
        "-H", f"X-API-KEY: {siesta.api_key()}",
        "--checks", "not_a_server_error",
        "--max-examples", str(EXAMPLES),
        "--seed", "12",
        "--request-timeout", "30",
        "--report-dir", str(tmp_path),
    ]
    # In the temporary directory: schemathesis keeps its own state in the
    # working directory (.schemathesis/).
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert httpx.get(f"{siesta.url}/health", timeout=10).status_code == 200
