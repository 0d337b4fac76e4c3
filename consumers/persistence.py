"""Persistence stage (``persistence``): ``GenerationFinished`` on ``chat.replies`` ->
the assistant message in Cassandra (status, usage, model), the generation row, the
conversation moved to the top of its owner's list; after the first exchange a title
request to the small pool; finished titles and summaries stored.

Every write is keyed (conversation + turn + message id, generation id) and uses the
event's own timestamps, so a redelivered event rewrites the same values. Text arrives
sealed and is stored sealed (the repositories' sealer). For a no-retention plan only the
generation row (ids and counts) is written, and the conversation's data key is destroyed
as its reply ends. An event whose conversation's key is gone (deleted) is skipped.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from consumers.stage import Out, Stage
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.conversations import Conversation, Conversations, Message
from infra.stores.crypto import KeyGone
from infra.stores.records import Records, Summary
from infra.stores.sealing import Sealer
from infra.stores.search import TITLE, SearchIndex
from schemas import GenerationFinished, GenerationRequested, id_time
from schemas.scheduler import BACKGROUND_PRIORITY
from topics import GENERATE, Role, Topics
from topics.catalogue import DEADLETTER, PERSISTENCE, REPLIES

log = logging.getLogger(__name__)
ROLE = Role(PERSISTENCE, reads=(REPLIES,), writes=(GENERATE, DEADLETTER))
KNOWN_MAX = 20_000  # conversation rows remembered, the least recently used dropped first
KNOWN_FOR_S = 3_600.0  # and for at most this long (well inside a change mark's CHANGED_TTL_S)
TITLE_INSTRUCTION = ("Write a title of at most six words for this conversation. Reply with the title only, "
                     "no quotes.")


class Persistence:
    def __init__(self, conversations: Conversations, records: Records, redis: Any, topics: Topics,
                 chat_ids: Callable[[list[dict[str, str]]], list[int]], sealer: Sealer | None = None,
                 keep_nothing: frozenset[str] = frozenset(), search: SearchIndex | None = None) -> None:
        self.conversations, self.records, self.redis, self.topics = conversations, records, redis, topics
        self.chat_ids, self.sealer, self.keep_nothing, self.search = chat_ids, sealer, keep_nothing, search
        # The conversation rows this process last wrote (change mark, until, row), newest last. chat.replies is
        # keyed by conversation, so while a partition stays here nobody else moves its conversations up: a
        # conversation's next reply needs no read of its row (its list row's key, its title, its source).
        self._known: OrderedDict[str, tuple[bytes | None, float, Conversation]] = OrderedDict()

    async def handle(self, e: GenerationFinished) -> list[tuple[str, Any, str]]:
        """Apply one finished generation; returns events to send as (topic, event, key), sealed."""
        if e.plan in self.keep_nothing:
            return await self._keep_nothing(e)
        try:
            outs = await self._apply(await self.sealer.open(e) if self.sealer else e)
            return [(t, await self.sealer.seal(o) if self.sealer else o, k) for t, o, k in outs]
        except KeyGone:
            log.info("generation %s not saved: conversation %s deleted", e.generation_id, e.conversation_id)
            return []

    async def _keep_nothing(self, e: GenerationFinished) -> list[tuple[str, Any, str]]:
        if e.purpose == "reply":
            await self._save_generation(e)
            if self.sealer is not None:
                await self.sealer.keys.destroy(e.conversation_id)
            log.info("generation %s ended (%s, %d out tokens): nothing kept, data key destroyed", e.generation_id,
                     e.status, e.usage.completion_tokens)
        return []

    async def _apply(self, e: GenerationFinished) -> list[tuple[str, Any, str]]:
        if e.purpose == "title":
            await self._title(e)
            return []
        if e.purpose == "summary":
            # A summary cut at its token cap is still a summary: most of them are, on a small model.
            if e.status in ("complete", "length") and e.text.strip():
                await self.records.save_summary(Summary(e.conversation_id, e.turn, e.text.strip(),
                                                        e.usage.completion_tokens))
            await self.redis.delete(keys.summary_requested(e.conversation_id))  # the next one may be asked
            return []
        return await self._reply(e)

    async def _reply(self, e: GenerationFinished) -> list[tuple[str, Any, str]]:
        # The owner's epoch and the conversation's change mark: one Redis round trip.
        current, changed = await self.redis.mget([keys.generation_epoch(e.generation_id),
                                                  keys.conversation_changed(e.conversation_id)])
        if current is not None and 0 < e.epoch < int(current):
            log.warning("generation %s: finish of owner epoch %d ignored (epoch %s owns it)", e.generation_id,
                        e.epoch, current.decode())
            return []  # a fenced-off worker's finish: the current owner's is the one to save
        finished_at = datetime.fromtimestamp(e.at, UTC)
        if e.made_listed and changed is None:
            return await self._made_listed(e, finished_at)
        made = self._made_unlisted(e, changed)
        conv = made or await self._conversation(e.conversation_id, changed)
        if conv is None:
            return []  # deleted: nothing is written for it any more
        # An OpenAI-endpoint call is not in the sidebar, so it is neither searched nor titled there: indexing its
        # message (up to 400 words, a row per word prefix) and asking the small pool for a title were most of
        # the pipeline's CPU per API reply, and the title a second generation nobody would read.
        page = conv.source != "api"
        # The user message it answers (indexed with it, and the title's question) rides in the event: a finish
        # that carries none (made by the scheduler or the reaper, or written before) reads the turn's two rows,
        # the reply's placeholder (its created_at) and that message. An API reply needs neither. Without the
        # read, the reply is dated as its placeholder was: by its id's time.
        user = (e.parent_id, e.question) if page and e.parent_id and e.question else None
        made_at = _made_at(e, finished_at)
        if page and user is None:
            turn = await self.conversations.messages_of_turn(
                e.conversation_id, e.turn, {e.message_id} | ({e.parent_id} if e.parent_id else set()))
            existing, asked = turn.get(e.message_id), turn.get(e.parent_id) if e.parent_id else None
            made_at = existing.created_at if existing is not None and existing.created_at else finished_at
            user = (asked.message_id, asked.content) if asked is not None else None
        # Every write below is keyed and independent of the others (a redelivery rewrites the same values), so
        # they go out together: the stage waits one round trip for them, not three in a row. Persistence takes
        # one reply at a time, so its rate is bounded by this wait, not by its CPU.
        writes: list[Awaitable[Any]] = [self.conversations.save_message(_reply_row(e, made_at, finished_at))]
        # No ``generations`` row: the reply's own row names its generation, model and pool, and the gateway
        # finds a generation's owner in Redis (``generation_owner``, kept 7 days). Only a no-retention reply,
        # which has no row of its own, keeps its ids and counts there.
        if e.text.strip():  # no reply text: the conversation does not move up, nor enter the list
            # Made unlisted (by the OpenAI endpoints for this call, or by the page for its first message): listed
            # where it was made, its own row as it is (one statement; moving it up would add the row's update for
            # seconds of difference).
            writes.append(self._list_where_made(conv, changed) if made is not None or (conv.source == "api"
                                                                                        and e.turn == 0)
                          else self._touch(conv, changed, finished_at))
        if page:
            writes.append(self._index(e, user))
        await _all(writes)
        log.info("generation %s saved as %s: %d in / %d out tokens", e.generation_id, e.status,
                 e.usage.prompt_tokens, e.usage.completion_tokens)
        if page and conv.title is None and e.text.strip():  # complete, stopped or cut at the length limit alike
            return await self._ask_for_title(e, user[1] if user is not None else "")
        return []

    async def _made_listed(self, e: GenerationFinished, finished_at: datetime) -> list[tuple[str, Any, str]]:
        """The reply of an OpenAI call in the conversation the gateway made and listed for it: its row is not
        read (nobody has marked a change: not renamed, not deleted) and the list is left as it is, unless the
        reply has no text. Neither indexed nor titled, as every API reply."""
        writes: list[Awaitable[Any]] = [self.conversations.save_message(
            _reply_row(e, _made_at(e, finished_at), finished_at))]
        if not e.text.strip():  # as one never listed: not in the list (and still in its owner's index)
            writes.append(self.conversations.take_off_list(e.user_id, e.conversation_id))
        await _all(writes)
        log.info("generation %s saved as %s: %d in / %d out tokens", e.generation_id, e.status,
                 e.usage.prompt_tokens, e.usage.completion_tokens)
        return []

    def _made_unlisted(self, e: GenerationFinished, changed: bytes | None) -> Conversation | None:
        """The row of a page conversation its gateway made (untitled, no model named, unlisted) for this, its
        first message there, known without a read: made at its id's time. Only while nobody changed it (no
        change mark), this process knows no later row, and the reply is the conversation's first turn (a message
        through another gateway came first otherwise)."""
        if not e.made_unlisted or changed is not None or e.turn != 0 or e.conversation_id in self._known:
            return None
        made = id_time(e.conversation_id)
        return Conversation(e.conversation_id, e.user_id, None, None, made, "page") if made is not None else None

    async def _list_where_made(self, conv: Conversation, changed: bytes | None) -> None:
        await self.conversations.list_where_made(conv)
        self._remember(conv, changed)

    async def _index(self, e: GenerationFinished, user: tuple[str, str] | None) -> None:
        """The exchange becomes searchable once its reply is saved (the user message, (id, text), with it: off the
        hot path)."""
        if self.search is None:
            return
        entries = [(user[0], e.turn, user[1])] if user is not None else []
        if e.text.strip():
            entries.append((e.message_id, e.turn, e.text))
        await self.search.index_many(e.user_id, e.conversation_id, entries)  # one statement for the exchange

    async def _save_generation(self, e: GenerationFinished) -> None:
        await self.records.save_generation(
            generation_id=e.generation_id, conversation_id=e.conversation_id, user_id=e.user_id,
            message_id=e.message_id, user_message_id=e.parent_id or "", turn=e.turn, status=e.status,
            model_pool=e.pool, model=e.model, replica=e.worker_id, queued_at=e.started_at or None,
            first_token_at=e.first_token_at or None, finished_at=e.at)

    async def _ask_for_title(self, e: GenerationFinished, user: str) -> list[tuple[str, Any, str]]:
        if not await self.redis.set(keys.title_requested(e.conversation_id), e.generation_id, nx=True, ex=86400):
            return []  # asked already (this event is a redelivery, or another turn got there first)
        ids = self.chat_ids([{"role": "system", "content": TITLE_INSTRUCTION},
                             {"role": "user", "content": f"User: {user[:1500]}\nAssistant: {e.text[:1500]}"}])
        request = GenerationRequested(
            generation_id=f"{e.generation_id}:title", conversation_id=e.conversation_id, user_id=e.user_id,
            plan=e.plan, pool="small", lane="free", prompt_token_ids=ids, max_tokens=16, priority=BACKGROUND_PRIORITY,
            purpose="title", temperature=0.0)
        return [(self.topics.generate("small", "free"), request, e.conversation_id)]

    async def _title(self, e: GenerationFinished) -> None:
        title = _clean_title(e.text)
        if not title:
            return
        changed = await self.redis.get(keys.conversation_changed(e.conversation_id))
        conv = await self._conversation(e.conversation_id, changed)
        if conv is None or conv.title is not None:
            return  # deleted, or already titled (by the user's rename, or an earlier title)
        # Its row alone (the list reads titles there, and the list row stays where it is), and its search rows.
        await _all([self._retitle(conv, changed, title),
                    *([self.search.index(conv.user_id, conv.conversation_id, TITLE, -1, title)]
                      if self.search is not None else [])])
        log.info("conversation %s titled (%d chars)", e.conversation_id, len(title))

    async def _conversation(self, conversation_id: str, changed: bytes | None) -> Conversation | None:
        """The conversation's row: as this process last wrote it, while nobody else changed it (its change mark
        is as it was then) and for at most ``KNOWN_FOR_S``; else read. A deleted one is None, and the read of its
        row is not needed for that: the deletion destroys the data key (the event cannot be opened) and marks a
        change."""
        hit = self._known.get(conversation_id)
        if hit is not None and hit[0] == changed and hit[1] > time.monotonic():
            return hit[2]
        self._known.pop(conversation_id, None)
        conv = await self.conversations.get(conversation_id)
        if conv is not None:
            self._remember(conv, changed)
        return conv

    async def _touch(self, conv: Conversation, changed: bytes | None, at: datetime) -> None:
        self._known.pop(conv.conversation_id, None)  # unknown until the writes are done
        self._remember(await self.conversations.touch(conv, at), changed)

    async def _retitle(self, conv: Conversation, changed: bytes | None, title: str) -> None:
        self._known.pop(conv.conversation_id, None)  # unknown until the write is done
        self._remember(await self.conversations.retitle(conv, title), changed)

    def _remember(self, conv: Conversation, changed: bytes | None) -> None:
        self._known[conv.conversation_id] = (changed, time.monotonic() + KNOWN_FOR_S, conv)
        self._known.move_to_end(conv.conversation_id)
        while len(self._known) > KNOWN_MAX:
            self._known.popitem(last=False)

    def forget_conversations(self) -> None:
        """Its partitions of ``chat.replies`` moved: another process may write their conversations' rows now."""
        self._known.clear()


async def _all(writes: list[Awaitable[Any]]) -> None:
    """Every write, at once; the first failure raises once all have settled (the event is then applied again,
    and each write, keyed, rewrites the same values)."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed


def _made_at(e: GenerationFinished, finished_at: datetime) -> datetime:
    """When the reply was made: its id's time (as its placeholder was dated), else its start, else its end."""
    return id_time(e.message_id) or (datetime.fromtimestamp(e.started_at, UTC) if e.started_at else finished_at)


def _reply_row(e: GenerationFinished, made: datetime, finished_at: datetime) -> Message:
    return Message(
        e.conversation_id, e.turn, e.message_id, "assistant", e.text, status=e.status,
        tokens_in=e.usage.prompt_tokens, tokens_out=e.usage.completion_tokens,
        tokens_cached=e.usage.cached_prompt_tokens, model=e.model, pool=e.pool, parent_id=e.parent_id,
        generation_id=e.generation_id, route_reason=e.route_reason,
        created_at=made, finished_at=finished_at,
        block_category=e.block.category if e.block else None,
        rules_version=e.block.rules_version if e.block else None)


def _clean_title(text: str) -> str:
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    return line.strip().strip('"\'*#').removeprefix("Title:").strip()[:80]


def build_stage(settings: Settings, persistence: Persistence) -> Stage:
    """The stage over ``chat.replies`` (keyed by conversation): a partition's replies of different conversations
    are saved concurrently, each conversation's in order. Saving one reply waits on two or three store round
    trips and little CPU, so one at a time bounded the stage's rate by that wait (its records fell behind at
    12 req/s on this machine while its process used 0.4 of a core). The handler opens and seals itself: its
    outputs (a title's request) are sealed for the conversation."""
    async def handle(e: GenerationFinished) -> list[Out]:
        return [Out(t, o, k) for t, o, k in await persistence.handle(e)]

    return Stage(ROLE, settings, (GenerationFinished,), handle, per_key=True,
                 on_moved=persistence.forget_conversations)
