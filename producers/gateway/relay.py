"""Token delivery: a tail of the partitions of ``chat.tokens`` this gateway owns, fanned out to the streams
it serves, plus replay from any offset so a client can resume on any gateway with ``Last-Event-ID``.

Gateway i of N owns the partitions p with p % N == i and mints the ids of the generations it starts so
their records land there (``ownership.py``); it reads no record of another gateway's partitions unless a
stream here follows a generation on one, and then through one tail of that partition shared by all such
streams (``tails.py``). With one gateway (the default) it owns every partition.

A generation's events all sit in one partition (keyed by generation id), so the
SSE id is just the Kafka offset. Resume = subscribe live first, replay from the
offset to the partition's end, then continue live, skipping offsets already sent.

The tail never stops on a store: an event whose data key cannot be read (the key store
down, and the key not cached) waits in its generation's backlog, retried with backoff,
while every other generation's events go on; that generation's later events queue
behind it, so each stream still gets its events in order and none is lost.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from aiokafka import ConsumerRecord, TopicPartition

from infra.stores.crypto import KeyGone
from infra.stores.retry import FIRST_DELAY_S, MAX_DELAY_S, STORE_DOWN
from infra.stores.sealing import Sealer
from producers.gateway import ownership
from producers.gateway.tails import Borrowing, PartitionTail
from schemas import EventDecodeError, GenerationFinished, RequestRefused, decode_record, new_id
from schemas.errors import ParleyError
from topics.partitioning import partition_for
from topics.replay import open_reader, read_to_end

log = logging.getLogger(__name__)


REPLAY_FETCH_BYTES = 64 * 1024


class Aged(ParleyError):
    """The generation's events are older than the token buffer keeps."""


class TokenRelay:
    def __init__(self, bootstrap: str, topic: str, sealer: Sealer | None = None, *, index: int = 0,
                 count: int = 1, linger_s: float = 5.0) -> None:
        self.bootstrap, self.topic, self.sealer = bootstrap, topic, sealer
        self.index, self.count = index, count
        self.subs: dict[str, set[asyncio.Queue[tuple[int, Any]]]] = {}
        self.partitions = 0
        self.mine: frozenset[int] = frozenset()  # empty until start(): every partition counts as owned
        self.read: Counter[int] = Counter()  # records fetched per partition, by every tail of this gateway
        self.tail = PartitionTail(bootstrap, topic, self._records, self.read, "owned")
        self.borrowed = Borrowing(bootstrap, topic, self._records, self.read, linger_s)
        # generation id -> events (decoded, not yet opened) waiting behind one whose key could not be read
        self.backlog: dict[str, list[tuple[int, Any]]] = {}
        self._drains: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        def choose(count: int) -> frozenset[int]:
            self.partitions, self.mine = count, ownership.owned(self.index, self.count, count)
            return self.mine
        await self.tail.start(choose)

    async def stop(self) -> None:
        for task in self._drains:
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        await self.borrowed.stop()
        await self.tail.stop()

    def new_generation_id(self) -> str:
        """A generation id whose records land on a partition this gateway tails."""
        return ownership.mint(self.mine, self.partitions) if self.mine else new_id()

    def owns(self, generation_id: str) -> bool:
        return not self.mine or partition_for(generation_id, self.partitions) in self.mine

    async def _records(self, records: list[ConsumerRecord]) -> None:
        for record in records:
            key = record.key.decode() if record.key else ""
            if not self.subs.get(key):
                continue  # decode only what someone here is reading
            try:
                await self._deliver(key, record.offset, decode_record(record))
            except EventDecodeError:
                continue
            except Exception:  # noqa: BLE001 - one event must never stop delivery to every stream
                log.exception("generation %s: event at offset %d not delivered", key, record.offset)

    async def _deliver(self, generation_id: str, offset: int, event: Any) -> None:
        waiting = self.backlog.get(generation_id)
        if waiting is not None:
            waiting.append((offset, event))  # behind an event still waiting for its key: order is kept
            return
        try:
            opened = await self._open(event)
        except KeyGone:
            return
        except STORE_DOWN as exc:
            log.warning("generation %s: data key unreadable (%s); its events wait, the others go on",
                        generation_id, type(exc).__name__)
            self.backlog[generation_id] = [(offset, event)]
            drain = asyncio.create_task(self._drain(generation_id), name=f"relay-backlog-{generation_id}")
            self._drains.add(drain)
            drain.add_done_callback(self._drains.discard)
            return
        self._fan_out(generation_id, offset, opened)

    async def _drain(self, generation_id: str) -> None:
        """Open and deliver a generation's waiting events in order, retrying while the key store is down."""
        delay = FIRST_DELAY_S
        waiting = self.backlog[generation_id]
        try:
            while waiting and self.subs.get(generation_id):
                offset, event = waiting[0]
                try:
                    opened = await self._open(event)
                except KeyGone:
                    waiting.pop(0)
                    continue
                except STORE_DOWN:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_DELAY_S)
                    continue
                except Exception:  # noqa: BLE001 - not a store outage: this event cannot be opened
                    log.exception("generation %s: event at offset %d not delivered", generation_id, offset)
                    waiting.pop(0)
                    continue
                waiting.pop(0)
                self._fan_out(generation_id, offset, opened)
        finally:
            self.backlog.pop(generation_id, None)

    def _fan_out(self, generation_id: str, offset: int, event: Any) -> None:
        for q in self.subs.get(generation_id, ()):
            q.put_nowait((offset, event))

    async def _open(self, event: Any) -> Any:
        """Token text opened for the streams; a miss on the key cache costs one Cassandra read, once per
        conversation per cache period. A deleted conversation's events are dropped, except its end."""
        if self.sealer is None:
            return event
        try:
            return await self.sealer.open(event)
        except KeyGone:
            if isinstance(event, GenerationFinished):  # deleted mid-reply: the end still ends the stream
                return msgspec.structs.replace(event, text="")
            raise

    def subscribe(self, generation_id: str) -> asyncio.Queue[tuple[int, Any]]:
        """A queue of the generation's live events. On a partition this gateway does not own, the partition's
        borrowed tail starts (or is shared); ``attach`` waits until it is positioned."""
        q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.subs.setdefault(generation_id, set()).add(q)
        if not self.owns(generation_id):
            self.borrowed.take(partition_for(generation_id, self.partitions))
        return q

    def unsubscribe(self, generation_id: str, q: asyncio.Queue[tuple[int, Any]]) -> None:
        queues = self.subs.get(generation_id)
        if queues is None or q not in queues:
            return
        queues.discard(q)
        if not queues:
            del self.subs[generation_id]
        if not self.owns(generation_id):
            self.borrowed.leave(partition_for(generation_id, self.partitions))

    async def attach(self, generation_id: str) -> None:
        """Returns once a live subscription to ``generation_id`` misses nothing produced from now on: at once
        on an owned partition, after the borrowed tail found its end on another gateway's."""
        if not self.owns(generation_id):
            await self.borrowed.ready(partition_for(generation_id, self.partitions))

    def partition_of(self, generation_id: str) -> TopicPartition:
        return TopicPartition(self.topic, partition_for(generation_id, self.partitions))

    async def check_offset(self, generation_id: str, offset: int) -> int | None:
        """``offset`` as a resume point: None when it is another generation's event (no stream of this
        one sent it); the partition's last offset when it lies past the end (nothing to replay; the
        stream then ends with the final state, or follows a live generation from here)."""
        reader = await open_reader(self.bootstrap, self.topic, key=generation_id, fetch_max_wait_ms=5,
                                   max_partition_fetch_bytes=REPLAY_FETCH_BYTES)
        tp = reader.partitions[0]
        try:
            end = reader.ends[tp]
            if offset >= end:
                return end - 1
            if offset < (await reader.consumer.beginning_offsets([tp]))[tp]:
                return offset  # aged out: the saved reply is served
            reader.consumer.seek(tp, offset)
            async for record in read_to_end(reader, tp, timeout_ms=500):
                # A transaction marker's offset yields a later record first: only that exact one can be foreign.
                foreign = record.offset == offset and (record.key or b"").decode() != generation_id
                return None if foreign else offset
            return offset
        finally:
            await reader.close()

    async def final_event(self, generation_id: str, since_ms: int) -> tuple[int, Any] | None:
        """The generation's last event (finished or refused) if the buffer holds it, else None."""
        async for offset, event in self.replay(generation_id, None, since_ms):
            if isinstance(event, (GenerationFinished, RequestRefused)):
                return offset, event
        return None

    async def replay(self, generation_id: str, after: int | None, since_ms: int) -> AsyncIterator[tuple[int, Any]]:
        """Events of one generation after offset ``after`` (or since ``since_ms``) up to the partition's end now.
        A live subscription made before it continues where it ends: a borrowed tail is positioned first."""
        await self.attach(generation_id)
        # Small fetches: the first replayed event reaches the client after 64 KiB is read, not after 1 MiB
        # of other generations' records sharing the partition.
        reader = await open_reader(self.bootstrap, self.topic, key=generation_id,
                                   since_ms=since_ms if after is None else None, fetch_max_wait_ms=5,
                                   max_partition_fetch_bytes=REPLAY_FETCH_BYTES)
        tp = reader.partitions[0]
        try:
            if after is not None:
                if after + 1 < (await reader.consumer.beginning_offsets([tp]))[tp]:
                    raise Aged(generation_id)
                reader.consumer.seek(tp, after + 1)
            async for record in read_to_end(reader, tp, timeout_ms=500):
                if record.key and record.key.decode() == generation_id:
                    try:
                        event = await self._open(decode_record(record))
                    except (EventDecodeError, KeyGone):
                        continue
                    yield record.offset, event
        finally:
            await reader.close()
