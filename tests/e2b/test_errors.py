"""Error cases the SDK turns into its own exceptions."""

import os

import pytest
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
)

MISSING = "nosuchsandbox0000000"


def test_unknown_sandbox(siesta):
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(MISSING)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(MISSING)
    assert Sandbox.kill(MISSING) is False


def test_envd_call_to_a_killed_sandbox(siesta):
    box = Sandbox.create(template="base", timeout=120)
    box.kill()
    assert box.is_running() is False
    with pytest.raises(SandboxException) as exc:
        box.commands.run("echo never")
    assert "was not found" in str(exc.value)


def test_bad_template(siesta):
    with pytest.raises(SandboxException):
        Sandbox.create(template="no-such-template-xyz", timeout=60)


def test_bad_api_key(siesta):
    with pytest.raises(AuthenticationException):
        Sandbox.create(template="base", api_key="siesta_wrong")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="siesta_wrong").next_items()
    assert os.environ["E2B_API_KEY"] != "siesta_wrong"


def test_minted_key_has_the_shape_every_sdk_accepts(siesta):
    """SDK 2.45 refuses keys that are not `e2b_` + hex; ours must pass it."""
    import re

    key = siesta.api_key()
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", key), key
    wrong = "e2b_" + "0" * 40
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=wrong).next_items()


def test_a_mount_of_a_missing_volume_is_refused_rather_than_ignored(siesta):
    """A sandbox that silently lacked its volume would lose what the agent
    writes there (mounts themselves: test_volume_mounts.py)."""
    with pytest.raises(SandboxException) as err:
        Sandbox.create(template="base", volume_mounts={"/mnt/data": "no-such-volume"})
    assert "volume \"no-such-volume\" not found" in str(err.value), str(err.value)


def test_options_not_supported_yet_are_refused_by_name(api, sbx):
    """`iam` and storing a secret are 400s naming what is not supported,
    never accepted and done otherwise; the defaults the SDK sends stay
    accepted (the fixture's sandbox was created by the SDK). Filesystem-only
    pause and snapshot are supported (test_filesystem_pause.py)."""
    sid = sbx.sandbox_id
    cases = [
        ("/v2/sandboxes", {"templateID": "base", "iam": {"tokens": {"a": {}}}}, "iam is not supported"),
        ("/secrets", {"name": "token", "value": "s3cr3t"}, "secrets are not supported"),
    ]
    for path, body, says in cases:
        r = api.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert says in r.json()["message"], (path, r.text)
    assert api.get("/secrets").json() == []
    r = api.get("/secrets/anything")
    assert r.status_code == 404 and "stores no secrets" in r.json()["message"]
    assert sbx.is_running()
    assert sbx.commands.run("echo still").stdout.strip() == "still"
