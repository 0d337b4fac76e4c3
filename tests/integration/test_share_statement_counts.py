"""Cassandra statements that sharing and exporting cost, counted by Cassandra itself (the same private service
and counters as ``test_statement_counts.py``): making a share link, reading it without a token, and exporting
a conversation each stay within a small bound, whatever the conversation's length."""
from __future__ import annotations

import httpx
import pytest

from infra.local.loadtest_service import PrivateService
from producers.loadgen.statements import StatementCounter, difference
from tests.integration.test_statement_counts import _user, service  # noqa: F401 - the private service

pytestmark = pytest.mark.integration

SHARE = 6  # the conversation's row, one page of its messages, the user's shares, two inserts (measured 5)
READ = 2  # the share's row, and its conversation's data key when this gateway has not cached it (measured 2)
EXPORT = 3  # the conversation's row, one page of its messages (measured 2)
QUIET_S = 4.0  # the pipeline is done when no counter has moved for this long


async def _cost(counter: StatementCounter, send) -> dict[str, int]:  # type: ignore[no-untyped-def]
    before = await counter.quiet(QUIET_S)
    await send()
    spent = difference(before, await counter.quiet(QUIET_S))
    print(f"\n{send.__name__}: {sum(spent.values())} statements")
    for key in sorted(spent):
        print(f"  {key:45} {spent[key]}")
    return spent


async def test_share_read_and_export_cost_a_few_statements(service: PrivateService) -> None:  # noqa: F811
    counter = StatementCounter(service.settings)
    if not await counter.count():  # a keyspace with no counters yet reads empty: make one move
        await _user(service.settings)
    headers = {"Authorization": f"Bearer {await _user(service.settings)}"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=120) as http:
        conversation_id = (await http.post("/v1/conversations", json={})).json()["conversation_id"]
        for n in range(3):
            async with http.stream("POST", f"/v1/conversations/{conversation_id}/messages",
                                   json={"content": f"Question {n}?"}) as response:
                assert response.status_code == 200
                assert "message_end" in "".join([line async for line in response.aiter_lines()])
        made: dict[str, str] = {}

        async def share() -> None:
            r = await http.post(f"/v1/conversations/{conversation_id}/share")
            assert r.status_code == 201, r.text
            made.update(r.json())

        async def read() -> None:
            async with httpx.AsyncClient(base_url=service.url) as anonymous:
                r = await anonymous.get(f"/v1/shares/{made['share_id']}")
            assert r.status_code == 200 and len(r.json()["messages"]) == 6

        async def export() -> None:
            r = await http.get(f"/v1/conversations/{conversation_id}/export", params={"format": "markdown"})
            assert r.status_code == 200 and r.text.count("\n## ") == 6

        costs = {"share": await _cost(counter, share), "read": await _cost(counter, read),
                 "export": await _cost(counter, export)}
    totals = {name: sum(spent.values()) for name, spent in costs.items()}
    print("statements:", totals)
    assert totals["share"] <= SHARE and totals["read"] <= READ and totals["export"] <= EXPORT, costs
    assert costs["read"].get("read shares", 0) >= 1  # counted where it ran: the counters see this service's reads
