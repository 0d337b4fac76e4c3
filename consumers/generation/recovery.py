"""Continue a generation another worker started: what was already appended to ``chat.tokens``.

The saved tokens never change. A new worker builds its prompt as original prompt
+ saved token ids, continues the sequence numbers, and, if the reply had already
finished, re-announces that finish instead of generating again.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from consumers.generation.fencing import is_current
from schemas import EventDecodeError, GenerationFinished, GenerationStarted, TokensAppended, decode_record
from schemas.errors import ParleyError
from topics.replay import open_reader, read_to_end

log = logging.getLogger(__name__)

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
    """Fold one partition's events into what was saved for ``generation_id`` (duplicates by seq ignored,
    and events of an owner epoch older than one already seen)."""
    saved, epoch = Saved(), 0
    for event in events:
        if getattr(event, "generation_id", None) != generation_id:
            continue
        if not is_current(event, epoch):
            continue  # a fenced-off worker's late append: a newer owner took over
        epoch = max(epoch, getattr(event, "epoch", 0))
        if isinstance(event, GenerationStarted) and saved.started is None:
            saved.started = event
        elif isinstance(event, TokensAppended):
            saved.chunks.setdefault(event.seq, event)
        elif isinstance(event, GenerationFinished):
            saved.finished = event
    return saved


class IncompleteRead(ParleyError, RuntimeError):
    """The token buffer's partition could not be read to its end (fetches kept coming back empty)."""


async def read_saved(bootstrap: str, tokens_topic: str, generation_id: str, since_ms: int,
                     attempts: int = 4) -> Saved:
    """Scan the generation's partition of the token buffer from ``since_ms`` to its current end.

    All of it or nothing: continuing from a prefix of what was appended would append chunks under seqs the
    clients already have, which they drop, so what they read would differ from what is saved. A read that
    stops short (a slow broker, a loaded machine) is tried again from the start."""
    for attempt in range(1, attempts + 1):
        reader = await open_reader(bootstrap, tokens_topic, since_ms=since_ms, key=generation_id)
        try:
            tp = reader.partitions[0]
            events: list[object] = []
            async for record in read_to_end(reader, tp, timeout_ms=1000):
                try:
                    events.append(decode_record(record, TOKEN_EVENTS))
                except EventDecodeError:
                    continue  # other event types share the partition
            if await reader.consumer.position(tp) >= reader.ends[tp]:
                return collect(events, generation_id)
            log.warning("generation %s: token buffer read stopped at %d of %d (attempt %d of %d)", generation_id,
                        await reader.consumer.position(tp), reader.ends[tp], attempt, attempts)
        finally:
            await reader.close()
    raise IncompleteRead(f"generation {generation_id}: could not read its saved tokens to the end")
