"""Keys for crypto-erasure: per-tenant key-encryption keys and per-conversation data keys.

Every piece of user or model text is sealed with its conversation's data key (AES-256-GCM).
A data key is stored only wrapped by its tenant's key, in Cassandra's ``conversation_keys``
(durable like the content it protects; a lost key would lose the conversation). Deleting
the row destroys the key: every copy of the conversation's text, in Kafka segments,
replicas, backups or Cassandra files, becomes ciphertext nobody can open.

The hot path stays cheap: each process caches unwrapped keys for ``cache_s`` seconds, so a
token event costs one AES-GCM operation and no I/O; a miss is one Cassandra read by
primary key. The cache bounds how long a destroyed key lives on in a process's memory.

``TenantKeys`` is the seam for a KMS or Vault: ``wrap``/``unwrap`` of a 32-byte data key, and
``index_key``, the tenant's key for the search index's keyed hashes (a KMS's HMAC key: GenerateMac).
The embedded ``LocalTenantKeys`` derives each tenant's keys (HKDF-SHA256) from one master key
in ``<state>/keys/master.key``, made on first use, readable by its owner only.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from infra.stores.following import FollowedCache
from infra.stores.session import AsyncSession
from schemas.errors import ParleyError

NONCE_BYTES = 12


class KeyGone(ParleyError, LookupError):
    """The conversation's data key was destroyed (deleted) or never made: its text cannot be read."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id} has no data key")
        self.conversation_id = conversation_id


class TenantKeys(Protocol):
    """Wraps data keys under a tenant's key. A KMS plugs in here: ``wrap`` = Encrypt (or
    GenerateDataKey), ``unwrap`` = Decrypt, with ``context`` as the encryption context."""

    def wrap(self, tenant_id: str, data_key: bytes, context: bytes) -> bytes: ...

    def unwrap(self, tenant_id: str, wrapped: bytes, context: bytes) -> bytes: ...

    def index_key(self, tenant_id: str) -> bytes: ...


class LocalTenantKeys:
    """Tenant keys derived from one local master key file (the embedded default)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._master: bytes | None = None
        self._derived: dict[str, AESGCM] = {}
        self._index: dict[str, bytes] = {}

    @classmethod
    def under(cls, state_dir: Path) -> LocalTenantKeys:
        return cls(state_dir / "keys" / "master.key")

    def master(self) -> bytes:
        if self._master is None:
            self._master = _read_or_create(self.path)
        return self._master

    def _kek(self, tenant_id: str) -> AESGCM:
        kek = self._derived.get(tenant_id)
        if kek is None:
            raw = HKDF(hashes.SHA256(), 32, salt=b"parley-tenant-key", info=tenant_id.encode()).derive(self.master())
            kek = self._derived[tenant_id] = AESGCM(raw)
        return kek

    def index_key(self, tenant_id: str) -> bytes:
        """The tenant's search-index key: HMAC terms nobody without the master key can compute or guess."""
        key = self._index.get(tenant_id)
        if key is None:
            key = self._index[tenant_id] = HKDF(hashes.SHA256(), 32, salt=b"parley-search-key",
                                                info=tenant_id.encode()).derive(self.master())
        return key

    def wrap(self, tenant_id: str, data_key: bytes, context: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._kek(tenant_id).encrypt(nonce, data_key, context)

    def unwrap(self, tenant_id: str, wrapped: bytes, context: bytes) -> bytes:
        return self._kek(tenant_id).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], context)


def _read_or_create(path: Path) -> bytes:
    """Read the master key, or make it: written to a private temp file, then linked into place, so
    processes starting together agree on one key and none ever reads a half-written file."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(32))
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process won: use its key
    finally:
        tmp.unlink()
    return path.read_bytes()


log = logging.getLogger(__name__)
KEYS_DESTROYED = "parley:keys:destroyed"  # pub/sub channel: the id of each conversation whose data key is destroyed
KEYS_MADE = "parley:keys:made"  # pub/sub channel: each new conversation's id, tenant and wrapped key
LIVE_CACHE_S = 300.0  # how long a key stays cached while destructions can be heard
MADE_KEEP_S = 120.0  # how long a key heard made is kept, unread, for this process's first use of it
MADE_KEPT_MAX = 20_000  # the most keys heard made and not read yet (the oldest are dropped first)
CACHE_PRUNE_AT = 4_096  # the cache drops its expired keys when it grows past this


class DataKeys(FollowedCache):
    """Per-conversation data keys: made once, wrapped in Cassandra, cached unwrapped per process.

    Without Redis a process keeps a key ``cache_s``. Given Redis, it follows ``KEYS_DESTROYED``: a destruction
    anywhere drops the key from every following process at once, so while the subscription holds a key is kept
    ``live_cache_s`` (a conversation's turns minutes apart read it once). A lost subscription forgets every
    key and caches for ``cache_s`` only until it is back; a load that spans a destruction or a loss is kept
    ``cache_s`` too. The purge's delay stays longer than ``cache_s``: the bound when nothing is heard.

    A process that makes a key announces it, wrapped, on ``KEYS_MADE`` before it returns the new conversation,
    so any destruction of it is announced after; a following process keeps what it hears ``MADE_KEEP_S`` and
    unwraps it at its first use, so the stages and workers serving a new conversation's first turns read no
    key from Cassandra. Pub/sub messages are not written to Redis's append-only file: the wrapped key is kept
    only in Cassandra and in memory, and a destruction still drops it everywhere.
    """

    channel = KEYS_DESTROYED
    also = (KEYS_MADE,)
    lost_note = "keys kept only cache_s until it is back"

    def __init__(self, db: AsyncSession, tenants: TenantKeys, cache_s: float = 10.0, redis: Any = None,
                 live_cache_s: float = LIVE_CACHE_S) -> None:
        super().__init__(redis)
        self.db, self.tenants, self.cache_s, self.live_cache_s = db, tenants, cache_s, live_cache_s
        self._cache: dict[str, tuple[float, AESGCM]] = {}
        self._loading: dict[str, asyncio.Future[AESGCM | None]] = {}
        self._made: dict[str, tuple[float, str, bytes]] = {}  # heard made, not read yet: (until, tenant, wrapped)
        self._prune_at = CACHE_PRUNE_AT
        # Told of each forgotten key (its conversation id; None: all of them), to drop what they derived from it.
        self.listeners: list[Callable[[str | None], None]] = []

    def live(self, heard: int) -> bool:
        """Whether what was read while ``heard`` was current may be kept ``live_cache_s``."""
        return self.subscribed and heard == self.heard

    def _keep(self, conversation_id: str, key: AESGCM, heard: int) -> None:
        keep = self.live_cache_s if self.live(heard) else self.cache_s
        now = time.monotonic()
        self._cache[conversation_id] = (now + keep, key)
        if len(self._cache) > self._prune_at:  # expired keys are dropped in bulk, not one per read
            self._cache = {cid: hit for cid, hit in self._cache.items() if hit[0] > now}
            self._prune_at = max(CACHE_PRUNE_AT, 2 * len(self._cache))

    async def create(self, conversation_id: str, tenant_id: str) -> AESGCM:
        """The key of a conversation made now. A plain write, not a lightweight transaction: the only caller
        (``Conversations.create``) passes an id it has just minted, so no other key can exist to race with."""
        raw = AESGCM.generate_key(256)
        wrapped = self.tenants.wrap(tenant_id, raw, conversation_id.encode())
        # Stored and announced at once: one wait. Announced but not stored (the write failed) is harmless: no
        # conversation is made without its key, and a key heard is only kept wrapped for a while.
        await asyncio.gather(self.db.execute(
            "INSERT INTO conversation_keys (conversation_id, tenant_id, wrapped_key, created_at) VALUES (?, ?, ?, ?)",
            (conversation_id, tenant_id, wrapped, datetime.now(UTC))),
            self._announce(conversation_id, tenant_id, wrapped))
        key = AESGCM(raw)
        self._keep(conversation_id, key, self.heard)
        return key

    async def _announce(self, conversation_id: str, tenant_id: str, wrapped: bytes) -> None:
        if self.redis is None:
            return
        try:
            await self.redis.publish(KEYS_MADE, f"{conversation_id}\n{tenant_id}\n".encode() + wrapped)
        except Exception as exc:  # noqa: BLE001 - the others read it from Cassandra instead
            log.warning("conversation %s: key not announced (%s)", conversation_id, type(exc).__name__)

    def heard_other(self, channel: str, data: bytes) -> None:
        """A key made elsewhere: kept wrapped until it is first read here, or ``MADE_KEEP_S``."""
        parts = data.split(b"\n", 2)
        if len(parts) != 3:
            return  # not an announcement this version writes: the key is read from Cassandra when needed
        raw_id, tenant_id, wrapped = parts
        conversation_id = raw_id.decode(errors="replace")
        if conversation_id in self._cache:
            return  # made here
        now = time.monotonic()
        self._made[conversation_id] = (now + MADE_KEEP_S, tenant_id.decode(errors="replace"), wrapped)
        while self._made:  # oldest first: drop what expired or overflows (one look when nothing has)
            oldest = next(iter(self._made))
            if self._made[oldest][0] > now and len(self._made) <= MADE_KEPT_MAX:
                break
            del self._made[oldest]

    def _heard_made(self, conversation_id: str) -> AESGCM | None:
        made = self._made.pop(conversation_id, None)
        if made is None or made[0] <= time.monotonic() or not self.subscribed:
            return None
        key = AESGCM(self.tenants.unwrap(made[1], made[2], conversation_id.encode()))
        self._keep(conversation_id, key, self.heard)
        return key

    async def get(self, conversation_id: str) -> AESGCM:
        """The unwrapped key, from the cache or Cassandra; ``KeyGone`` when there is none."""
        self.start()
        hit = self._cache.get(conversation_id)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        if (made := self._heard_made(conversation_id)) is not None:
            return made
        loading = self._loading.get(conversation_id)
        if loading is None:  # one read per key however many events wait on it
            loading = self._loading[conversation_id] = asyncio.ensure_future(self._load(conversation_id))
            loading.add_done_callback(lambda _: self._loading.pop(conversation_id, None))
        key = await asyncio.shield(loading)
        if key is None:
            self._cache.pop(conversation_id, None)
            raise KeyGone(conversation_id)
        return key

    async def _load(self, conversation_id: str) -> AESGCM | None:
        heard = self.heard
        rows = await self.db.execute(
            "SELECT tenant_id, wrapped_key FROM conversation_keys WHERE conversation_id = ?", (conversation_id,))
        if not rows:
            return None
        key = AESGCM(self.tenants.unwrap(rows[0].tenant_id, rows[0].wrapped_key, conversation_id.encode()))
        self._keep(conversation_id, key, heard)
        return key

    async def ensure(self, conversation_id: str, tenant_id: str) -> AESGCM:
        """The key of a live conversation, made if it has none (one made before sealing, or a no-retention
        conversation whose last reply destroyed it)."""
        try:
            return await self.get(conversation_id)
        except KeyGone:
            return await self.create(conversation_id, tenant_id)

    async def exists(self, conversation_id: str) -> bool:
        try:
            await self.get(conversation_id)
        except KeyGone:
            return False
        return True

    async def destroy(self, conversation_id: str) -> None:
        """Crypto-erasure: the wrapped key is deleted; this process forgets it at once, every process following
        the channel as soon as it hears, any other within ``cache_s``."""
        self.forget(conversation_id)
        await self.db.execute("DELETE FROM conversation_keys WHERE conversation_id = ?", (conversation_id,))
        if self.redis is not None:
            try:
                await self.redis.publish(KEYS_DESTROYED, conversation_id)
            except Exception as exc:  # noqa: BLE001 - the others still drop it within cache_s; the purge waits longer
                log.warning("conversation %s: key destruction not announced (%s)", conversation_id,
                            type(exc).__name__)

    def forget(self, conversation_id: str) -> None:
        self.heard += 1
        self._cache.pop(conversation_id, None)
        self._made.pop(conversation_id, None)
        for listener in self.listeners:
            listener(conversation_id)

    def forget_all(self) -> None:
        self.heard += 1
        self._cache.clear()
        self._made.clear()
        for listener in self.listeners:
            listener(None)
