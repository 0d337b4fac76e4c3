"""The gateway's memory of conversation owners: kept while deletions can be heard, dropped when one is."""
from __future__ import annotations

from pathlib import Path

from infra.stores.crypto import DataKeys, KeyGone, LocalTenantKeys
from producers.gateway.owners import Owners
from tests.fake_stores import FakeConversations, conversation
from tests.unit.test_sealing import Channel, KeyTable, _until


async def _follow(keys: DataKeys) -> None:
    try:
        await keys.get("warm-up")  # the first use starts following the channel
    except KeyGone:
        pass
    await _until(lambda: keys.subscribed)


async def test_an_owner_is_read_once_while_heard_and_forgotten_when_its_key_is_destroyed(tmp_path: Path) -> None:
    redis = Channel()
    convs = FakeConversations(conversation("c1", "ann"))
    keys = DataKeys(KeyTable(), LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    elsewhere = DataKeys(KeyTable(), LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    owners = Owners(convs, keys)  # type: ignore[arg-type]
    await _follow(keys)
    assert [await owners.owner("c1") for _ in range(5)] == ["ann"] * 5
    assert convs.reads == 1
    del convs.conversations["c1"]  # deleted, and its key destroyed by another gateway
    await elsewhere.destroy("c1")
    await _until(lambda: "c1" not in owners._owners)  # noqa: SLF001
    assert await owners.owner("c1") is None
    await keys.stop()
    await elsewhere.stop()


async def test_nothing_is_kept_while_deletions_cannot_be_heard(tmp_path: Path) -> None:
    convs = FakeConversations(conversation("c1", "ann"))
    keys = DataKeys(KeyTable(), LocalTenantKeys.under(tmp_path), cache_s=0.0)  # type: ignore[arg-type]  # no Redis
    owners = Owners(convs, keys)  # type: ignore[arg-type]
    for _ in range(3):
        assert await owners.owner("c1") == "ann"
    assert convs.reads == 3
    assert await owners.owner("missing") is None


async def test_a_conversation_made_here_is_owned_without_a_read_unless_a_destruction_came_between(
        tmp_path: Path) -> None:
    redis = Channel()
    convs = FakeConversations(conversation("c1", "ann"), conversation("c2", "bob"))
    keys = DataKeys(KeyTable(), LocalTenantKeys.under(tmp_path), cache_s=0.0, redis=redis)  # type: ignore[arg-type]
    owners = Owners(convs, keys)  # type: ignore[arg-type]
    await _follow(keys)
    owners.made("c1", "ann", keys.heard)
    assert await owners.owner("c1") == "ann" and convs.reads == 0
    heard = keys.heard
    keys.forget("other")  # a destruction heard while c2 was being made: its owner is read, not assumed
    owners.made("c2", "bob", heard)
    assert await owners.owner("c2") == "bob" and convs.reads == 1
    await keys.stop()


async def test_a_conversation_made_unlisted_here_has_one_first_message_here(tmp_path: Path) -> None:
    keys = DataKeys(KeyTable(), LocalTenantKeys.under(tmp_path), cache_s=0.0)  # type: ignore[arg-type]
    owners = Owners(FakeConversations(), keys, keep_s=60.0)  # type: ignore[arg-type]
    owners.made_unlisted("c1", "Be brief.")
    owners.made_unlisted("c2", None)
    assert owners.first_message("c0") is None  # made elsewhere (or titled, or with a model)
    first = owners.first_message("c1")
    assert first is not None and first.instructions == "Be brief."  # what its prompt needs besides the message
    assert owners.first_message("c1") is None  # asked once: the next is not first
    second = owners.first_message("c2")
    assert second is not None and second.instructions is None
    owners.made_unlisted("c3", None)
    owners._forget("c3")  # noqa: SLF001 - its key destroyed (deleted): nothing is told about it
    assert owners.first_message("c3") is None
    stale = Owners(FakeConversations(), keys, keep_s=0.0)  # type: ignore[arg-type]
    stale.made_unlisted("c4", None)
    assert stale.first_message("c4") is None  # kept no longer than an owner is
