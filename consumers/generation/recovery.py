"""Continue a generation another worker started: what was already appended to ``chat.tokens``.

The saved tokens never change. A new worker builds its prompt as original prompt
+ saved token ids, continues the sequence numbers, and, if the reply had already
finished, re-announces that finish instead of generating again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas import EventDecodeError, GenerationFinished, GenerationStarted, TokensAppended, decode
from topics.clients import topic_partitions
from topics.partitioning import partition_for

TOKEN_EVENTS = (GenerationStarted, TokensAppended, GenerationFinished)


@dataclass
class Saved:
    started: GenerationStarted | None = None
    chunks: dict[int, TokensAppended] = field(default_factory=dict)
    finished: GenerationFinished | None = None

    @property
    def next_seq(self) -> int:
        return max(self.chunks) + 1 if self.chunks else 0

    @property
    def token_ids(self) -> list[int]:
        """The saved ids (chunks opened by the worker; a still-sealed chunk has none to offer)."""
        return [t for seq in sorted(self.chunks) for t in self.chunks[seq].token_ids if isinstance(t, int)]

    @property
    def text(self) -> str:
        return "".join(self.chunks[seq].text for seq in sorted(self.chunks))

    @property
    def contiguous(self) -> bool:
        return sorted(self.chunks) == list(range(len(self.chunks)))


def collect(events: list[object], generation_id: str) -> Saved:
    """Fold one partition's events into what was saved for ``generation_id`` (duplicates by seq ignored)."""
    saved = Saved()
    for event in events:
        if getattr(event, "generation_id", None) != generation_id:
            continue
        if isinstance(event, GenerationStarted) and saved.started is None:
            saved.started = event
        elif isinstance(event, TokensAppended):
            saved.chunks.setdefault(event.seq, event)
        elif isinstance(event, GenerationFinished):
            saved.finished = event
    return saved


async def read_saved(bootstrap: str, tokens_topic: str, generation_id: str, since_ms: int) -> Saved:
    """Scan the generation's partition of the token buffer from ``since_ms`` to its current end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await topic_partitions(consumer, tokens_topic)
        tp = TopicPartition(tokens_topic, partition_for(generation_id, len(partitions)))
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        found = (await consumer.offsets_for_times({tp: max(since_ms, 0)}))[tp]
        start = found.offset if found else end
        consumer.seek(tp, start)
        events: list[object] = []
        while start < end:
            batch = await consumer.getmany(tp, timeout_ms=500)
            for record in batch.get(tp, []):
                start = record.offset + 1
                try:
                    events.append(decode(record.value, TOKEN_EVENTS))
                except EventDecodeError:
                    continue  # other event types share the partition
        return collect(events, generation_id)
    finally:
        await consumer.stop()
