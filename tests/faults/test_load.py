"""Load through the E2B SDK and the API (issue 14): 16 creates at once,
100 commands at once across those sandboxes, and 200 API clients listing
and getting at once. Every call must succeed; figures are printed, never
asserted (the machines are shared)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from e2b import Sandbox
from helpers import TEMPLATE, remove_tagged

CREATES = 16
COMMANDS = 100
CLIENTS = 200


def test_concurrent_creates_commands_and_api_clients(node):
    tag = "load"
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(CREATES) as pool:
            boxes = list(pool.map(
                lambda _: Sandbox.create(TEMPLATE, timeout=900, metadata={"fault": tag}),
                range(CREATES)))
        creates_s = time.monotonic() - started
        assert len({b.sandbox_id for b in boxes}) == CREATES

        def command(i: int) -> None:
            box = boxes[i % CREATES]
            out = box.commands.run(f"echo {i}-$((6*7))", timeout=300)
            assert out.exit_code == 0 and out.stdout.strip() == f"{i}-42", out

        started = time.monotonic()
        with ThreadPoolExecutor(COMMANDS) as pool:
            list(pool.map(command, range(COMMANDS)))
        commands_s = time.monotonic() - started

        headers = {"X-API-KEY": node.api_key()}
        ids = [b.sandbox_id for b in boxes]

        def client(i: int) -> None:
            with httpx.Client(base_url=node.url, headers=headers, timeout=120) as c:
                listed = c.get("/v2/sandboxes", params={"metadata": f"fault={tag}"})
                assert listed.status_code == 200, listed.text
                got = c.get(f"/sandboxes/{ids[i % CREATES]}")
                assert got.status_code == 200 and got.json()["state"] == "running", got.text

        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(client, range(CLIENTS)))
        clients_s = time.monotonic() - started
        print(f"\nload: {CREATES} creates in {creates_s:.1f} s, {COMMANDS} commands in "
              f"{commands_s:.1f} s, {CLIENTS} API clients in {clients_s:.1f} s, 0 errors")
    finally:
        remove_tagged(node, tag)
