"""Sealing and key handling without services: an in-memory stand-in for the ``conversation_keys`` table."""
from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag

from infra.stores.crypto import KEYS_DESTROYED, KEYS_MADE, DataKeys, KeyGone, LocalTenantKeys
from infra.stores.sealing import SEALED_FIELDS, Sealer, is_sealed
from schemas import (
    GenerationFinished,
    GenerationRequested,
    MessageSubmitted,
    TokensAppended,
    Usage,
    decode,
    encode,
)
from schemas.gateway import ChatTurn


class KeyTable:
    """Just the three statements DataKeys runs."""

    def __init__(self) -> None:
        self.rows: dict[str, SimpleNamespace] = {}
        self.reads = 0

    async def execute(self, cql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        if cql.startswith("INSERT"):
            assert " IF " not in cql  # a new conversation's id is new: no lightweight transaction
            cid, tenant, wrapped, _ = params
            self.rows[cid] = SimpleNamespace(tenant_id=tenant, wrapped_key=wrapped)
            return []
        if cql.startswith("SELECT"):
            self.reads += 1
            return [self.rows[params[0]]] if params[0] in self.rows else []
        self.rows.pop(params[0], None)
        return []


@pytest.fixture
def table() -> KeyTable:
    return KeyTable()


@pytest.fixture
def sealer(tmp_path: Path, table: KeyTable) -> Sealer:
    return Sealer(DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=60))  # type: ignore[arg-type]


def submitted(cid: str, content: str = "the secret plan is Tuesday") -> MessageSubmitted:
    return MessageSubmitted(generation_id="g1", conversation_id=cid, user_id="u1", plan="free", message_id="m1",
                            client_message_id="c1", content=content,
                            history=[ChatTurn("user", "earlier words")])


async def test_every_text_field_is_sealed_and_opens_back(sealer: Sealer) -> None:
    await sealer.keys.create("conv-a", "u1")
    event = submitted("conv-a")
    sealed = await sealer.seal(event)
    wire = encode(sealed)
    assert b"secret plan" not in wire and b"earlier words" not in wire
    assert is_sealed(sealed.content) and is_sealed(sealed.history)
    assert await sealer.open(decode(wire)) == event


async def test_token_ids_and_text_round_trip(sealer: Sealer) -> None:
    await sealer.keys.create("conv-a", "u1")
    tokens = TokensAppended(generation_id="g1", conversation_id="conv-a", user_id="u1", seq=3, text=" Paris",
                            token_ids=[7, 65_000, 2**31])
    sealed = await sealer.seal(tokens)
    assert sealed.sealed.startswith("pe1.") and sealed.token_ids == [] and b"Paris" not in encode(sealed)
    assert await sealer.open(decode(encode(sealed))) == tokens
    request = GenerationRequested(generation_id="g1", conversation_id="conv-a", user_id="u1", plan="free",
                                  pool="large", lane="free", prompt_token_ids=list(range(500)), max_tokens=9)
    assert (await sealer.open(await sealer.seal(request))).prompt_token_ids == list(range(500))


async def test_destroyed_key_makes_every_copy_unreadable(sealer: Sealer, table: KeyTable) -> None:
    await sealer.keys.create("conv-a", "u1")
    copy = encode(await sealer.seal(submitted("conv-a")))  # e.g. a record in a Kafka segment or a backup
    await sealer.keys.destroy("conv-a")
    with pytest.raises(KeyGone):
        await sealer.open(decode(copy))
    assert "conv-a" not in table.rows
    assert await sealer.open_text("conv-a", decode(copy).content) is None  # a stored row reads as no text


async def test_a_value_moved_to_another_conversation_does_not_open(sealer: Sealer) -> None:
    await sealer.keys.create("conv-a", "u1")
    await sealer.keys.create("conv-b", "u1")
    sealed = await sealer.seal(submitted("conv-a"))
    moved = decode(encode(sealed).replace(b"conv-a", b"conv-b"))
    with pytest.raises(KeyGone):
        await sealer.open(moved)


async def test_keys_are_cached_per_process(sealer: Sealer, table: KeyTable, tmp_path: Path) -> None:
    await sealer.keys.create("conv-a", "u1")
    other = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=60)  # type: ignore[arg-type]
    for _ in range(50):
        await other.get("conv-a")
    assert table.reads == 1


async def test_a_created_key_is_the_one_every_process_reads(sealer: Sealer, table: KeyTable,
                                                            tmp_path: Path) -> None:
    first = await sealer.keys.create("conv-a", "u1")
    other = DataKeys(table, LocalTenantKeys.under(tmp_path))  # type: ignore[arg-type]
    second = await other.get("conv-a")
    nonce = b"\0" * 12
    assert second.decrypt(nonce, first.encrypt(nonce, b"x", None), None) == b"x"


def test_master_key_file_is_private_and_stable(tmp_path: Path) -> None:
    keys = LocalTenantKeys.under(tmp_path)
    wrapped = keys.wrap("tenant-1", b"k" * 32, b"conv-a")
    path = tmp_path / "keys" / "master.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    assert LocalTenantKeys.under(tmp_path).unwrap("tenant-1", wrapped, b"conv-a") == b"k" * 32
    with pytest.raises(InvalidTag):  # another tenant's key does not unwrap it
        LocalTenantKeys.under(tmp_path).unwrap("tenant-2", wrapped, b"conv-a")


async def test_unsealed_and_empty_values_pass_through(sealer: Sealer) -> None:
    finished = GenerationFinished(generation_id="g1", conversation_id="none", user_id="u1", plan="free",
                                  message_id="m", status="stopped", text="", usage=Usage(), model="m", pool="large",
                                  worker_id="w")
    assert await sealer.seal(finished) is finished  # nothing to seal: no key is needed
    assert await sealer.open_text("none", "written before sealing") == "written before sealing"


def test_the_usage_topic_carries_no_text() -> None:
    from schemas import UsageRecorded

    assert UsageRecorded not in SEALED_FIELDS
    text_like = {f for f in UsageRecorded.__struct_fields__ if f in ("text", "content", "title", "summary")}
    assert not text_like


async def test_the_relay_drops_a_deleted_conversations_tokens_but_still_ends_its_stream(sealer: Sealer) -> None:
    from producers.gateway.relay import TokenRelay

    await sealer.keys.create("conv-a", "u1")
    tokens = await sealer.seal(TokensAppended(generation_id="g1", conversation_id="conv-a", user_id="u1", seq=0,
                                              text=" secret", token_ids=[5]))
    end = await sealer.seal(GenerationFinished(generation_id="g1", conversation_id="conv-a", user_id="u1",
                                               plan="free", message_id="g1", status="stopped", text=" secret",
                                               usage=Usage(), model="m", pool="large", worker_id="w"))
    relay = TokenRelay("127.0.0.1:1", "t.chat.tokens", sealer)
    assert (await relay._open(tokens)).text == " secret"  # noqa: SLF001 - the relay's one opening step
    await sealer.keys.destroy("conv-a")
    with pytest.raises(KeyGone):
        await relay._open(tokens)  # noqa: SLF001
    opened_end = await relay._open(end)  # noqa: SLF001
    assert opened_end.status == "stopped" and opened_end.text == ""


async def test_the_relay_holds_a_generations_events_while_its_key_is_unreadable_and_the_others_go_on(
        sealer: Sealer) -> None:
    """The key store down and a key not cached: that generation's events wait in order (none lost) while
    another generation's are delivered; when the store answers they all arrive. Before, the first such
    event raised out of the relay's tail and the gateway stopped delivering to every stream."""
    from cassandra import OperationTimedOut

    from producers.gateway.relay import TokenRelay

    await sealer.keys.create("conv-a", "u1")
    await sealer.keys.create("conv-b", "u2")
    sealed = [await sealer.seal(TokensAppended(generation_id="g1", conversation_id="conv-a", user_id="u1", seq=i,
                                               text=f" a{i}", token_ids=[i])) for i in range(3)]
    other = await sealer.seal(TokensAppended(generation_id="g2", conversation_id="conv-b", user_id="u2", seq=0,
                                             text=" b0", token_ids=[9]))
    relay = TokenRelay("127.0.0.1:1", "t.chat.tokens", sealer)
    down = {"conv-a": 2}  # the first two reads of conv-a's key time out
    real_open = sealer.open

    async def flaky_open(event):  # type: ignore[no-untyped-def]
        if down.get(event.conversation_id, 0) > 0:
            down[event.conversation_id] -= 1
            raise OperationTimedOut("key store paused")
        return await real_open(event)

    sealer.open = flaky_open  # type: ignore[method-assign]
    q1, q2 = relay.subscribe("g1"), relay.subscribe("g2")
    for offset, event in enumerate(sealed):
        await relay._deliver("g1", offset, event)  # noqa: SLF001 - the tail's per-record step
    await relay._deliver("g2", 10, other)  # noqa: SLF001
    assert q2.get_nowait()[1].text == " b0" and q1.empty()  # the other generation is not held up
    for _ in range(50):
        if q1.qsize() == 3:
            break
        await asyncio.sleep(0.1)
    got = [q1.get_nowait() for _ in range(q1.qsize())]
    assert [(o, e.text) for o, e in got] == [(0, " a0"), (1, " a1"), (2, " a2")]  # in order, none lost
    assert relay.backlog == {}


def test_the_search_key_is_per_tenant_stable_and_comes_from_the_master_key(tmp_path: Path) -> None:
    keys = LocalTenantKeys.under(tmp_path)
    assert len(keys.index_key("ann")) == 32 and keys.index_key("ann") != keys.index_key("bob")
    assert LocalTenantKeys.under(tmp_path).index_key("ann") == keys.index_key("ann")  # same master, same key
    assert LocalTenantKeys.under(tmp_path / "other").index_key("ann") != keys.index_key("ann")


async def test_an_alternate_prompt_for_the_overflow_pool_is_sealed_with_the_main_one(sealer: Sealer) -> None:
    from schemas import PromptBuilt
    from schemas.prompt import PoolPrompt

    await sealer.keys.create("conv-a", "u1")
    built = PromptBuilt(generation_id="g1", conversation_id="conv-a", user_id="u1", plan="free", pool="large",
                        user_message_id="m1", assistant_message_id="g1", turn=0, prompt_token_ids=[5, 6, 7],
                        max_tokens=64, reserved_tokens=100, question="where is the okapi",
                        alternates=[PoolPrompt(pool="small", max_tokens=32, prompt_token_ids=[6, 7, 123_456])])
    sealed = await sealer.seal(built)
    assert is_sealed(sealed.alternates) and is_sealed(sealed.prompt_token_ids)
    assert b"123456" not in encode(sealed) and b"okapi" not in encode(sealed)
    assert await sealer.open(decode(encode(sealed))) == built


async def test_a_kept_records_user_fields_are_sealed_and_the_rest_stays_readable(sealer: Sealer,
                                                                                   table: KeyTable) -> None:
    await sealer.keys.create("c1", "u1")
    echo = {"instructions": "answer as the okapi herder", "metadata": {"trip": "okapi herder"}, "background": True,
            "previous_response_id": None}
    sealed = await sealer.seal_values("c1", echo, ("instructions", "metadata", "previous_response_id"))
    assert "okapi" not in repr(sealed) and is_sealed(sealed["instructions"]) and is_sealed(sealed["metadata"])
    assert sealed["background"] is True and sealed["previous_response_id"] is None  # left as it was
    assert await sealer.open_values("c1", sealed, ("instructions", "metadata")) == echo
    assert await sealer.seal_values("c1", sealed, ("instructions",)) == sealed  # sealed once, not twice
    await sealer.keys.destroy("c1")
    gone = await sealer.open_values("c1", sealed, ("instructions", "metadata"))
    assert gone["instructions"] is None and gone["metadata"] is None and gone["background"] is True


def test_a_digest_is_stable_per_tenant_and_keyed(sealer: Sealer, tmp_path: Path, table: KeyTable) -> None:
    import hashlib

    a = sealer.digest("u1", "conv-a", "my-retry-id")
    assert a == sealer.digest("u1", "conv-a", "my-retry-id") and len(a) == 32
    assert a != sealer.digest("u2", "conv-a", "my-retry-id") and a != sealer.digest("u1", "conv-b", "my-retry-id")
    assert a not in hashlib.sha256(b"conv-a\0my-retry-id").hexdigest()  # not a plain hash anyone could compute
    other = Sealer(DataKeys(table, LocalTenantKeys(tmp_path / "other.key"), cache_s=60))  # type: ignore[arg-type]
    assert other.digest("u1", "conv-a", "my-retry-id") != a  # another master key, another digest


class Channel:
    """Just the pub/sub Redis calls DataKeys makes: publish, and a subscription that can be cut."""

    def __init__(self) -> None:
        self.queues: list[asyncio.Queue[dict[str, Any]]] = []
        self.names: dict[int, tuple[str, ...]] = {}  # id of a subscriber's queue -> the channels it follows
        self.published: list[str] = []

    async def publish(self, channel: str, data: str | bytes) -> int:
        self.published.append(channel)
        heard = [q for q in self.queues if channel in self.names[id(q)]]
        for q in heard:
            q.put_nowait({"type": "message", "channel": channel.encode(),
                          "data": data if isinstance(data, bytes) else data.encode()})
        return len(heard)

    def cut(self) -> None:
        for q in self.queues:
            q.put_nowait({"type": "cut"})

    def pubsub(self) -> Any:
        channel = self

        class PubSub:
            def __init__(self) -> None:
                self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

            async def subscribe(self, *names: str) -> None:
                channel.queues.append(self.queue)
                channel.names[id(self.queue)] = names
                for name in names:
                    self.queue.put_nowait({"type": "subscribe", "channel": name.encode()})

            async def listen(self):  # type: ignore[no-untyped-def]
                while True:
                    message = await self.queue.get()
                    if message["type"] == "cut":
                        raise ConnectionError("cut")
                    yield message

            async def aclose(self) -> None:
                channel.queues.remove(self.queue)

        return PubSub()


async def _until(check: Any) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never")


async def _destroyed_and_gone_elsewhere(mine: DataKeys, other: DataKeys, conversation_id: str) -> None:
    """``mine`` destroys the key; ``other``, following the channel, drops it at once and reads it as gone."""
    await mine.destroy(conversation_id)
    await _until(lambda: conversation_id not in other._cache)  # noqa: SLF001
    with pytest.raises(KeyGone):
        await other.get(conversation_id)
    await mine.stop()
    await other.stop()


async def test_a_destruction_heard_drops_the_key_at_once_and_a_live_key_is_kept_long(table: KeyTable,
                                                                                     tmp_path: Path) -> None:
    redis = Channel()
    mine = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    other = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    await mine.create("conv-a", "u1")
    with pytest.raises(KeyGone):
        await other.get("conv-b")  # starts the follower
    await _until(lambda: other.subscribed)
    reads = table.reads
    for _ in range(5):
        await other.get("conv-a")
    assert table.reads == reads + 1  # kept, although cache_s is 0: destructions can be heard
    await _destroyed_and_gone_elsewhere(mine, other, "conv-a")


async def test_a_lost_subscription_forgets_every_key_and_keeps_none_long(table: KeyTable, tmp_path: Path) -> None:
    redis = Channel()
    keys = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    await keys.create("conv-a", "u1")
    await keys.get("conv-a")
    await _until(lambda: keys.subscribed)
    await keys.get("conv-a")
    assert "conv-a" in keys._cache  # noqa: SLF001
    redis.cut()
    await _until(lambda: not keys.subscribed)
    assert not keys._cache  # noqa: SLF001
    reads = table.reads
    await keys.get("conv-a")
    await keys.get("conv-a")
    assert table.reads == reads + 2  # kept cache_s (0) while nothing can be heard: it resubscribes after 1 s
    await keys.stop()


async def test_a_key_made_elsewhere_is_heard_and_read_without_cassandra_until_it_is_destroyed(
        table: KeyTable, tmp_path: Path) -> None:
    redis = Channel()
    maker = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    worker = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    worker.start()
    await _until(lambda: worker.subscribed)
    made = await maker.create("conv-a", "u1")
    assert redis.published == [KEYS_MADE]
    await _until(lambda: "conv-a" in worker._made)  # noqa: SLF001
    reads = table.reads
    key = await worker.get("conv-a")
    assert table.reads == reads  # heard, not read
    sealed = made.encrypt(b"0" * 12, b"hello", None)
    assert key.decrypt(b"0" * 12, sealed, None) == b"hello"  # the same key, unwrapped here
    await maker.create("conv-b", "u1")
    await _until(lambda: "conv-b" in worker._made)  # noqa: SLF001
    await maker.destroy("conv-b")  # destroyed before this process used it: the heard key is dropped too
    await _until(lambda: "conv-b" not in worker._made)  # noqa: SLF001
    with pytest.raises(KeyGone):
        await worker.get("conv-b")
    await _destroyed_and_gone_elsewhere(maker, worker, "conv-a")


async def test_a_key_heard_made_is_not_used_once_the_channel_is_lost(table: KeyTable, tmp_path: Path) -> None:
    redis = Channel()
    maker = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    worker = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    worker.start()
    await _until(lambda: worker.subscribed)
    await maker.create("conv-a", "u1")
    await _until(lambda: "conv-a" in worker._made)  # noqa: SLF001
    redis.cut()  # a destruction said now would not be heard: what was heard is forgotten
    await _until(lambda: not worker.subscribed)
    reads = table.reads
    await worker.get("conv-a")
    assert table.reads == reads + 1  # read from Cassandra
    await maker.stop()
    await worker.stop()


def test_an_announcement_that_is_not_one_is_ignored(table: KeyTable, tmp_path: Path) -> None:
    keys = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=Channel())  # type: ignore[arg-type]
    for data in (b"", b"conv-a", b"conv-a\nu1", b"\xff\xfe\nu1\nwrapped"):
        keys.heard_message({"type": "message", "channel": KEYS_MADE.encode(), "data": data})
    assert list(keys._made) == ["\ufffd\ufffd"]  # noqa: SLF001 - only the three-part one is kept; nothing raised


def test_only_a_subscription_to_every_channel_counts_as_subscribed(table: KeyTable, tmp_path: Path) -> None:
    keys = DataKeys(table, LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=Channel())  # type: ignore[arg-type]
    keys.heard_message({"type": "subscribe", "channel": KEYS_DESTROYED.encode()})
    assert not keys.subscribed  # a key made now would not be heard yet
    keys.heard_message({"type": "subscribe", "channel": KEYS_MADE.encode()})
    assert keys.subscribed
