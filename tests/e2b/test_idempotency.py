"""Idempotent creates (issue 17): `Sandbox.create(idempotency_key=...)`
retried gives the sandbox the first attempt made, also after a server
restart; the same key with another request is a 409, and a killed
sandbox's key is not reused silently."""

from __future__ import annotations

import uuid

import pytest
from e2b import Sandbox, SandboxException


def test_one_key_makes_one_sandbox_even_across_a_restart(siesta):
    key = f"retry-{uuid.uuid4().hex[:12]}"
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    a = Sandbox.create("base", timeout=300, metadata={"try": "same"}, idempotency_key=key)
    try:
        b = Sandbox.create("base", timeout=300, metadata={"try": "same"}, idempotency_key=key)
        assert b.sandbox_id == a.sandbox_id
        made = {s.sandbox_id for s in Sandbox.list().next_items()} - before
        assert made == {a.sandbox_id}, made

        with pytest.raises(SandboxException) as err:
            Sandbox.create("base", timeout=300, metadata={"try": "other"}, idempotency_key=key)
        assert "another request body" in str(err.value), str(err.value)

        # Kept in SQLite: a restart (which pauses the sandbox) changes
        # nothing, and the replay resumes it.
        a.files.write("/home/user/mark.txt", "first attempt")
        siesta.stop()
        siesta.start()
        c = Sandbox.create("base", timeout=300, metadata={"try": "same"}, idempotency_key=key)
        assert c.sandbox_id == a.sandbox_id
        assert c.files.read("/home/user/mark.txt") == "first attempt"
    finally:
        Sandbox.kill(a.sandbox_id)
    with pytest.raises(SandboxException) as err:
        Sandbox.create("base", timeout=300, metadata={"try": "same"}, idempotency_key=key)
    assert "no longer runs" in str(err.value), str(err.value)


def test_a_malformed_key_is_refused(api):
    """The SDK checks keys itself; the server does too, for other clients."""
    for key in ["Not Valid", "x" * 256]:
        r = api.post("/v2/sandboxes", json={"templateID": "base"},
                     headers={"Idempotency-Key": key})
        assert r.status_code == 400, r.text
        assert "Idempotency-Key" in r.json()["message"], r.text
