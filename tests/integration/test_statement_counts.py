"""Cassandra statements and Kafka records one request costs, counted by Cassandra and Kafka themselves.

A private service on sim engines (gateway, stages, workers, as `parley up` starts them) runs on a keyspace of
its own, so ``system_views``' per-table coordinator counters move only for what it does. One chat message (user
message to saved reply, usage and search index included) and one OpenAI chat completion are sent, the counters
are read before and after the pipeline has gone quiet, and the difference is printed per table and bounded:
a later feature cannot quietly double a request's cost. Deterministic: one request at a time, and the stages'
timers touch Cassandra only for records they did not count themselves. Kafka records are the growth of every
topic of the service's own prefix (changelogs included); the token records depend on the flush window's timing,
so they are bounded per token, the rest exactly.
"""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from infra.config.settings import Settings
from infra.local.loadtest_service import PrivateService, ServiceSpec, SimPool, launch
from producers.loadgen.offsets import prefixed_end_offsets
from producers.loadgen.statements import StatementCounter, difference

pytestmark = pytest.mark.integration

# Budgets (docs/performance.md, "Cassandra statements per request"): the targets are 8 and 6.
PER_CHAT_MESSAGE = 9  # the first of a conversation: its title is asked for, saved and indexed too (8; no key
#   read: the stages and workers heard the key made; no history read: the gateway that made it carries its copy
#   of the instructions; its row not read: persistence is told it was made there, unlisted, and lists it where
#   it was made; its title written to its row alone, the list reads it there; the user's new day counted with no
#   read of its totals)
PER_PAGE_FIRST_MESSAGE = 8  # 7: the same, as the page sends it (no client_message_id: nothing to claim)
PER_FOLLOW_UP = 9  # 8: the data key and the owner are read once per process while deletions can be heard; the
#   user message rides to persistence in the events (not read back to be indexed); persistence keeps the row it
#   wrote (not read again while nobody else changed it)
PER_PAGE_FOLLOW_UP = 8  # 7: the page sends no client_message_id, so nothing is claimed (a follow-up that
#   names one pays its durable claim, a Paxos round: 8)
PER_OPENAI_REQUEST = 7  # 6: no history read, no placeholder (the conversation is made for the call), no key read,
#   listed as it is made (its list row stands for its owner-index row), so persistence neither reads nor lists
#   it; no request writes a ``generations`` row (its reply's row names the generation)
# Kafka records a request writes besides its token records (docs/performance.md, "Kafka records per request").
# Each: chat.requests, .admitted, .prompts, generate.<pool>.<lane>, chat.replies, usage, and the plan-minute
# rollup's repartition and changelog records; the first message adds its title's request and finish (10, 8, 8).
RECORDS_PER_CHAT_MESSAGE = 10
RECORDS_PER_FOLLOW_UP = 8
RECORDS_PER_OPENAI_REQUEST = 8
TOKEN_RECORDS_PER_TOKEN = 0.5  # the flush window coalesces a sim reply's tokens into fewer records
TITLE_TOKENS = 16  # the first message's title is generated too
QUIET_S = 4.0  # the pipeline is done when no counter has moved for this long
SIM = {"reply_tokens": 24}


@pytest.fixture(scope="module")
def service(stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateService]:
    keyspace = f"{stack_settings.keyspace}_n"  # its own: no other test's statements in its counters
    spec = ServiceSpec({"large": SimPool(workers=1, max_num_seqs=8, sim=SIM),
                        "small": SimPool(workers=1, max_num_seqs=8, sim=SIM)})
    svc = launch(spec, tmp_path_factory.mktemp("counts"), keyspace)
    yield svc
    svc.stop()
    _drop(svc.settings)


def _drop(settings: Settings) -> None:
    from infra.stores.session import connect

    cluster, session = connect(settings, keyspace=None)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
    finally:
        cluster.shutdown()


async def _user(settings: Settings) -> str:
    from infra.stores.accounts import Accounts
    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(settings)
    try:
        _, token = await Accounts(AsyncSession(session)).create_user("paid")
    finally:
        cluster.shutdown()
    return token


async def _cost(counter: StatementCounter, settings: Settings, send) -> tuple[dict[str, int], dict[str, int]]:  # type: ignore[no-untyped-def]
    """(Cassandra statements per table, Kafka records per topic) that ``send`` cost."""
    before = await counter.quiet(QUIET_S)
    offsets = await prefixed_end_offsets(settings.kafka_bootstrap, settings.topic_prefix)
    await send()
    spent = difference(before, await counter.quiet(QUIET_S))
    after = await prefixed_end_offsets(settings.kafka_bootstrap, settings.topic_prefix)
    records = {t.removeprefix(settings.topic_prefix): n - offsets.get(t, 0) for t, n in after.items()
               if n != offsets.get(t, 0)}
    print(f"\n{send.__name__}: {sum(spent.values())} statements")
    for key in sorted(spent):
        print(f"  {key:45} {spent[key]}")
    print(f"{send.__name__}: {sum(records.values())} Kafka records")
    for key in sorted(records):
        print(f"  {key:45} {records[key]}")
    return spent, records


def _token_records(records: dict[str, int]) -> int:
    return sum(n for t, n in records.items() if t.startswith("chat.tokens"))


async def test_one_chat_message_and_one_openai_request(service: PrivateService) -> None:
    counter = StatementCounter(service.settings)
    if not await counter.count():  # a keyspace with no counters yet reads empty: make one move
        await _user(service.settings)
    token = await _user(service.settings)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=120) as http:
        # Custom instructions are set: the conversation keeps a copy, read with its history (no statement added).
        r = await http.patch("/v1/account", json={"instructions": "Answer in one short line."})
        assert r.status_code == 200, r.text
        r = await http.post("/v1/conversations", json={})
        assert r.status_code == 201, r.text
        conversation_id = r.json()["conversation_id"]

        r = await http.post("/v1/conversations", json={})
        assert r.status_code == 201, r.text
        page_conversation_id = r.json()["conversation_id"]

        async def chat_message(content: str = "What colour is the sky on a clear day?\nAnswer in one line.",
                               client_message_id: str | None = "counts-1", to: str = conversation_id) -> None:
            body = {"content": content, **({"client_message_id": client_message_id} if client_message_id else {})}
            async with http.stream("POST", f"/v1/conversations/{to}/messages", json=body) as response:
                assert response.status_code == 200
                text = "".join([line async for line in response.aiter_lines()])
            assert "message_end" in text, text[-500:]

        async def openai_request() -> None:
            r = await http.post("/v1/chat/completions", json={
                "model": "sim-large", "max_tokens": 24,
                "messages": [{"role": "user", "content": "What colour is the sky on a clear day?"}]})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]

        async def follow_up() -> None:
            await chat_message("And at sunset?", "counts-2")

        async def page_follow_up() -> None:  # as the page sends it: no client_message_id, nothing to claim
            await chat_message("And at night?", None)

        async def page_first_message() -> None:  # a new conversation's first message, as the page sends it
            await chat_message("Why is the sea blue?\nAnswer in one line.", None, page_conversation_id)

        chat, chat_records = await _cost(counter, service.settings, chat_message)
        more, more_records = await _cost(counter, service.settings, follow_up)
        page, page_records = await _cost(counter, service.settings, page_follow_up)
        first, first_records = await _cost(counter, service.settings, page_first_message)
        listed = (await http.get("/v1/conversations")).json()["items"]
        api, api_records = await _cost(counter, service.settings, openai_request)
    assert 0 < sum(chat.values()) <= PER_CHAT_MESSAGE, chat
    assert 0 < sum(more.values()) <= PER_FOLLOW_UP, more
    assert 0 < sum(page.values()) <= PER_PAGE_FOLLOW_UP, page
    assert 0 < sum(first.values()) <= PER_PAGE_FIRST_MESSAGE, first
    assert not [k for k in (*chat, *first) if k.startswith("read ") and not k.endswith((
        " messages_by_client_id", " usage_by_generation"))], (chat, first)  # nothing read but the claim and count
    # Both listed (the page's where it was made), each with the title its first exchange got (read from its row).
    assert {c["conversation_id"] for c in listed} == {page_conversation_id, conversation_id}, listed
    assert all(c["title"] for c in listed[:2]), listed
    assert not [k for k in page if k.endswith(" messages_by_client_id")], page  # no claim on a new id
    assert 0 < sum(api.values()) <= PER_OPENAI_REQUEST, api
    for records, budget, generated in (
            (chat_records, RECORDS_PER_CHAT_MESSAGE, SIM["reply_tokens"] + TITLE_TOKENS),
            (more_records, RECORDS_PER_FOLLOW_UP, SIM["reply_tokens"]),
            (page_records, RECORDS_PER_FOLLOW_UP, SIM["reply_tokens"]),
            (first_records, RECORDS_PER_CHAT_MESSAGE, SIM["reply_tokens"] + TITLE_TOKENS),
            (api_records, RECORDS_PER_OPENAI_REQUEST, SIM["reply_tokens"])):
        tokens = _token_records(records)
        assert 0 < tokens <= generated * TOKEN_RECORDS_PER_TOKEN, records
        assert 0 < sum(records.values()) - tokens <= budget, records
