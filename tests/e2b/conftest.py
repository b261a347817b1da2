"""Runs the official E2B Python SDK against a real `siesta serve`.

One server per session, on a free loopback port, with its own SIESTA_HOME
(a temporary directory: `assets` symlinked to the real assets, the `base`
template linked in from the real home's repository when it has one, else
built there once),
its own network tag and subnet. E2B_API_URL, E2B_SANDBOX_URL,
E2B_VOLUME_API_URL and E2B_API_KEY point the SDK at it. At the end the server is stopped by pid
(SIGTERM, then SIGKILL), even when tests fail, and no network namespace of
its tag may remain.

Environment: SIESTA_BIN (default target/release/siesta), SIESTA_HOME (the
real home with assets, default /var/lib/siesta), SIESTA_E2B_KEEP=1 keeps the
temporary home for debugging.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from server import (
    BINARY,
    SetupError,
    SiestaServer,
    build_base,
    prepare_home,
)

def _prepare_home() -> Path:
    try:
        return prepare_home("siesta-e2b-")
    except SetupError as e:
        pytest.exit(str(e), returncode=3)


def _build_template(home: Path, log: Path) -> None:
    try:
        build_base(home, log)
    except SetupError as e:
        pytest.exit(str(e), returncode=3)


@pytest.fixture(scope="session")
def siesta(tmp_path_factory):
    home = _prepare_home()
    log = tmp_path_factory.mktemp("logs") / "siesta.log"
    server = SiestaServer(BINARY, home, log)
    leftovers: list[str] = []
    try:
        _build_template(home, log)
        server.start()
        server.point_sdk_here()
        yield server
    finally:
        leftovers = server.stop_and_clean()
        print(f"\nsiesta log: {log}\n{server.log_tail(30)}")
        if os.environ.get("SIESTA_E2B_KEEP") != "1":
            shutil.rmtree(home, ignore_errors=True)
    assert not leftovers, f"network namespaces left by the server: {leftovers}"


@pytest.fixture(scope="session")
def api(siesta):
    """An httpx client for raw control-API calls, with the API key."""
    import httpx

    with httpx.Client(
        base_url=siesta.url,
        headers={"X-API-KEY": siesta.api_key()},
        timeout=30,
    ) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def sbx(siesta):
    """One running sandbox shared by a module's tests, killed at its end."""
    from e2b import Sandbox

    box = Sandbox.create(template="base", timeout=600, metadata={"suite": "e2b"})
    try:
        yield box
    finally:
        try:
            Sandbox.kill(box.sandbox_id)
        except Exception as e:  # report, but let the test results stand
            print(f"killing {box.sandbox_id}: {e}")
