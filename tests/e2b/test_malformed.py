"""Malformed requests: every answer is a 4xx with a JSON {"code","message"}
body, never a 5xx, never a hang (the client gives up after 30 s)."""

import json

import httpx
import pytest

CREATE = "/v2/sandboxes"

BAD_CREATES = {
    "not-json": b"{not json",
    "empty-body": b"",
    "json-array": b"[]",
    "json-string": b'"base"',
    "missing-templateID": b"{}",
    "templateID-number": b'{"templateID": 5}',
    "templateID-null": b'{"templateID": null}',
    "templateID-empty": b'{"templateID": ""}',
    "templateID-path": b'{"templateID": "../../etc"}',
    "timeout-negative": b'{"templateID": "base", "timeout": -5}',
    "timeout-huge": b'{"templateID": "base", "timeout": 1000000000000}',
    "timeout-string": b'{"templateID": "base", "timeout": "ten"}',
    "timeout-float": b'{"templateID": "base", "timeout": 1.5}',
    "metadata-string": b'{"templateID": "base", "metadata": "x"}',
    "metadata-nested": b'{"templateID": "base", "metadata": {"a": {"b": 1}}}',
    "envVars-number": b'{"templateID": "base", "envVars": {"A": 1}}',
    "autoPause-string": b'{"templateID": "base", "autoPause": "yes"}',
    "deep-nesting": b'{"templateID": "base", "metadata": ' + b"[" * 10000 + b"]" * 10000 + b"}",
}


def assert_json_4xx(resp: httpx.Response) -> dict:
    assert 400 <= resp.status_code < 500, f"{resp.status_code}: {resp.text[:300]}"
    try:
        body = resp.json()
    except json.JSONDecodeError:
        pytest.fail(f"{resp.status_code} body is not JSON: {resp.text[:300]!r}")
    assert isinstance(body, dict), body
    assert body.get("code") == resp.status_code, body
    assert isinstance(body.get("message"), str) and body["message"], body
    return body


def _kill_if_created(api, resp):
    if resp.status_code < 300:
        try:
            api.delete(f"/sandboxes/{resp.json()['sandboxID']}")
        except Exception:
            pass


@pytest.mark.parametrize("body", BAD_CREATES.values(), ids=BAD_CREATES.keys())
def test_bad_create_bodies(api, body):
    resp = api.post(CREATE, content=body, headers={"Content-Type": "application/json"})
    _kill_if_created(api, resp)
    assert_json_4xx(resp)


def test_missing_templateID_is_named(api):
    body = assert_json_4xx(api.post(CREATE, json={"timeout": 10}))
    assert "templateID" in body["message"]


def test_wrong_content_type(api):
    resp = api.post(CREATE, content=b'{"templateID":"base"}', headers={"Content-Type": "text/plain"})
    _kill_if_created(api, resp)
    assert_json_4xx(resp)


def test_huge_body(api):
    resp = api.post(
        CREATE,
        content=b'{"templateID": "base", "metadata": {"k": "' + b"x" * (16 << 20) + b'"}}',
        headers={"Content-Type": "application/json"},
    )
    _kill_if_created(api, resp)
    assert_json_4xx(resp)


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/no/such/path"),
        ("GET", "/v3/sandboxes"),
        ("GET", "/sandboxes/nosuchsandbox0000000"),
        ("DELETE", "/sandboxes/nosuchsandbox0000000"),
        ("POST", "/sandboxes/nosuchsandbox0000000/pause"),
        ("POST", "/v2/sandboxes/nosuchsandbox0000000/connect"),
        ("POST", "/sandboxes/nosuchsandbox0000000/timeout"),
        ("GET", "/sandboxes/nosuchsandbox0000000/metrics"),
        ("GET", "/sandboxes/..%2F..%2Fetc"),
        ("GET", "/sandboxes/%00"),
        ("DELETE", CREATE),
        ("PUT", CREATE),
        ("PATCH", "/sandboxes/nosuchsandbox0000000"),
        ("GET", "/sandboxes/nosuchsandbox0000000/pause"),
        ("DELETE", "/templates"),
    ],
)
def test_unknown_paths_and_wrong_methods(api, method, path):
    resp = api.request(method, path, json={} if method in ("POST", "PUT", "PATCH") else None)
    assert_json_4xx(resp)


@pytest.mark.parametrize(
    "query",
    [
        "limit=-1",
        "limit=abc",
        "limit=100000000000000000000",
        "state=bogus",
        "state=running,bogus",
        "nextToken=not-a-token",
        "metadata=%%%",
        "metadata=novalue",
        "startedAfter=yesterday",
        "order=sideways",
    ],
)
def test_bad_list_queries(api, query):
    assert_json_4xx(api.get(f"{CREATE}?{query}"))


@pytest.mark.parametrize(
    "path,body",
    [
        ("timeout", b"{}"),
        ("timeout", b'{"timeout": "x"}'),
        ("timeout", b'{"timeout": -1}'),
        ("timeout", b'{"timeout": 1000000000000}'),
        ("timeout", b"nope"),
        ("pause", b"nope"),
        ("pause", b'{"memory": "yes"}'),
        ("snapshots", b'{"name": 5}'),
        ("fork", b'{"count": 0}'),
        ("fork", b'{"count": 65}'),
        ("fork", b'{"count": 1000}'),
    ],
)
def test_bad_bodies_for_a_real_sandbox(api, sbx, path, body):
    resp = api.post(
        f"/sandboxes/{sbx.sandbox_id}/{path}",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert_json_4xx(resp)


def test_bad_connect_bodies(api, sbx):
    for body in [b"nope", b'{"timeout": -1}', b'{"timeout": "x"}']:
        resp = api.post(
            f"/v2/sandboxes/{sbx.sandbox_id}/connect",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert_json_4xx(resp)


def test_metrics_bad_range(api, sbx):
    assert_json_4xx(api.get(f"/sandboxes/{sbx.sandbox_id}/metrics?start=abc"))


def test_auth(siesta):
    for headers in [{}, {"X-API-KEY": ""}, {"X-API-KEY": "wrong"}, {"Authorization": "Bearer x"}]:
        resp = httpx.get(f"{siesta.url}{CREATE}", headers=headers, timeout=30)
        body = assert_json_4xx(resp)
        assert body["code"] == 401


def test_envd_front_door_bad_routes(siesta):
    base = siesta.url
    for headers in [
        {"E2b-Sandbox-Id": "../../etc"},
        {"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "http"},
        {"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "70000"},
    ]:
        assert_json_4xx(httpx.get(f"{base}/health", headers=headers, timeout=30))
    # A sandbox that does not exist: 502 with the message the SDK maps.
    resp = httpx.get(f"{base}/health", headers={"E2b-Sandbox-Id": "nosuch"}, timeout=30)
    assert resp.status_code == 502
    assert "was not found" in resp.json()["message"]
