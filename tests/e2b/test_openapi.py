"""The served OpenAPI document against the running router (issue 15): the
server serves the document its code makes (the same as docs/openapi.yaml),
and every operation it names is routed: a request to it without
credentials is turned away by authentication or by the handler, never by
the router's "no such endpoint" (404) or "method not allowed" (405)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import yaml

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
METHODS = ("get", "post", "put", "patch", "delete")
NOT_ROUTED = "no such endpoint"


def _served(siesta) -> tuple[str, dict]:
    r = httpx.get(f"{siesta.url}/openapi.yaml", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/yaml")
    return r.text, yaml.safe_load(r.text)


def _concrete(path: str) -> str:
    """A path with each parameter filled in (a SHA-256 shape for hashes)."""
    return re.sub(
        r"\{([^}]+)\}",
        lambda m: "0" * 64 if m.group(1) == "hash" else "no-such-thing",
        path,
    )


def _refusal(r: httpx.Response) -> str:
    try:
        return str(r.json().get("message", ""))
    except ValueError:
        return ""


def test_served_document_is_the_checked_in_one(siesta):
    text, doc = _served(siesta)
    assert text == DOCS.read_text(), "docs/openapi.yaml is not what the server serves"
    assert doc["openapi"].startswith("3.")


def test_every_documented_operation_is_routed(siesta):
    _, doc = _served(siesta)
    default_security = doc.get("security")
    checked = 0
    with httpx.Client(base_url=siesta.url, timeout=30) as client:
        for path, item in doc["paths"].items():
            for method in METHODS:
                op = item.get(method)
                if op is None:
                    continue
                r = client.request(method.upper(), _concrete(path))
                where = f"{method.upper()} {path}: {r.status_code} {r.text[:200]}"
                assert r.status_code != 405, where
                assert not (r.status_code == 404 and _refusal(r) == NOT_ROUTED), where
                if op.get("security", default_security) == [{"apiKey": []}]:
                    # The API-key layer sits on matched routes only.
                    assert r.status_code == 401, where
                checked += 1
    assert checked >= 47, f"only {checked} operations in the served document"


def test_the_check_can_fail(siesta):
    """What the test above rules out does happen for routes that are not
    there, so its passing means something."""
    with httpx.Client(base_url=siesta.url, timeout=30) as client:
        missing = client.get("/v9/not-an-endpoint")
        assert missing.status_code == 404 and _refusal(missing) == NOT_ROUTED
        wrong = client.request("PATCH", "/health")
        assert wrong.status_code == 405
