"""The official E2B JS SDK (tests/js, npm `e2b`) builds a template with its
`Template` builder against the same server and creates a sandbox from its
name (tests/js/template_build.mjs makes the checks; this runs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parent.parent / "js"


def test_js_sdk_template_build_then_create(siesta, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is missing: scripts/install-test-deps.sh installs it")
    if not (JS / "node_modules" / "e2b").is_dir():
        pytest.fail(f"the JS SDK is not installed in {JS}: run `make e2b-js`")
    (tmp_path / "note.txt").write_text("note from the JS SDK\n")
    name = f"js-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [node, str(JS / "template_build.mjs"), str(tmp_path), name],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'"template":"{name}"' in done.stdout, done.stdout
