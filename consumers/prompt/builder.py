"""Prompt build stage (group ``prompt``): ``RequestAdmitted`` on ``chat.admitted`` ->
``PromptBuilt`` on ``chat.prompts``.

Saves the user message in Cassandra *before* generation (key conversation + turn),
claims the client_message_id (a retried request joins the first one's generation),
loads history (with any reply that ended but is not saved yet), fits it to the pool's
window with the model's own tokenizer, and asks the small pool for a summary when
older turns fall out. A request it refuses gets its reservation released at once. A message admission's input check
blocked (``InputBlocked``) is saved as ``blocked``, its text replaced by the notice.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal

from consumers.deadlines import late
from consumers.prompt import summary as summaries
from consumers.prompt.branch import branch_turns, newest_reply
from consumers.prompt.fit import TooLong, Turn, Window, fit, fit_history, fit_window
from consumers.stage import Out
from infra.stores import keys
from infra.stores.conversations import ClientMessageClaim, Conversations, Message
from infra.stores.finished import FinishedReplies
from infra.stores.preferences import instructions_in, instructions_message
from infra.stores.records import Records, Summary
from schemas import (
    GenerationRequested,
    InputBlocked,
    PoolPrompt,
    PromptBuilt,
    RequestAdmitted,
    RequestRefused,
    id_time,
    own_client_message_id,
)
from schemas.scheduler import BACKGROUND_PRIORITY
from topics import GENERATE, Role, Topics
from topics.catalogue import ADMITTED, DEADLETTER, PROMPT, PROMPTS, TOKENS

log = logging.getLogger(__name__)
# Writes chat.tokens only to refuse a prompt that cannot fit; the summary request goes to the small pool.
ROLE = Role(PROMPT, reads=(ADMITTED,), writes=(PROMPTS, GENERATE, TOKENS, DEADLETTER))


@dataclasses.dataclass(frozen=True)
class Built:
    window: Window
    turns: list[Turn]
    alternates: list[PoolPrompt]
    dropped: bool = False  # older turns fell out of a window (this pool's or the alternate's)


@dataclasses.dataclass(frozen=True)
class Placed:
    """A request's turn, its user message and its fitted prompt."""

    turn: int
    user_message: Message
    built: Built


class PromptBuilder:
    def __init__(self, conversations: Conversations, records: Records, topics: Topics,
                 tokenizer_for_pool: Callable[[str], Any], budget: int, max_model_len: Callable[[str], int],
                 quota: Any = None, keep_nothing: frozenset[str] = frozenset(), redis: Any = None,
                 overflow_pool: str = "small", same_model: Callable[[str, str], bool] = lambda a, b: True,
                 honours: Callable[[str, str | None], bool] = lambda pool, tool_call: True) -> None:
        """``same_model(a, b)``: pools ``a`` and ``b`` serve one model (a prompt's token ids are valid for both);
        ``honours(pool, tool_call)``: ``pool`` can write a reply read for function calls that way."""
        self.conversations, self.records, self.topics = conversations, records, topics
        self.keep_nothing = keep_nothing  # no-retention plans: the prompt is built, no text is stored
        self.tokenizer_for_pool, self.budget, self.max_model_len = tokenizer_for_pool, budget, max_model_len
        self.quota, self.redis, self.overflow_pool, self.same_model = quota, redis, overflow_pool, same_model
        self.honours = honours
        self.finished = (FinishedReplies(redis, sealer=getattr(conversations, "sealer", None))
                         if redis is not None else None)

    async def handle(self, req: RequestAdmitted | InputBlocked) -> list[Out]:
        """The prompt for one admitted request, in numbered steps: each is a store round trip or a decision
        taken with no I/O (``place``, ``_build``, ``after_claim``), so a reader sees which is which."""
        if isinstance(req, InputBlocked):
            await self._save_blocked(req)
            return []
        # 1. Past its deadline: nothing is written, the reservation goes back at once.
        if await late(req.deadline, req.generation_id, self.redis):
            return await self._drop_late(req)
        began = time.perf_counter()
        # 2. Read the history (with any reply that ended but is not saved yet).
        history = await self._read(req)
        read_at = time.perf_counter()
        # 3. Decide where the message goes; its row and the reply's placeholder need only that, so their write
        #    starts now and its wait overlaps the fitting below (the tokenizer's work, any summary read).
        turn, user_message = self._place(req, history)
        if user_message is None:
            return await self._refused(req, 404, "invalid", "That message is no longer in the conversation.")
        rows = self._rows(req, turn, user_message, history)
        saving = asyncio.ensure_future(self.conversations.save_messages(
            rows, placeholder_at_id_time=_first_message(req))) if rows else None
        if saving is not None:
            await asyncio.sleep(0)  # the write runs up to its request to Cassandra before the fitting's CPU
        # 4. Fit the prompt to the pool's window, or refuse (taking the rows back). Only when older turns fall
        #    out are the latest summaries read (and the prompt fitted again): a conversation that fits its
        #    window whole costs no summaries read.
        try:
            summary: list[Summary] = []  # the newest two: one written ahead of the next drop stands in after it
            built = self._build(req, history, summary, user_message)
            if isinstance(built, Built) and built.dropped and req.history is None:
                summary = await self.records.latest_summaries(req.conversation_id)
                if summary:
                    built = self._build(req, history, summary, user_message)
        except BaseException:
            _left(saving)  # the handler fails (and is applied again): the write goes on, rewritten then
            raise
        if isinstance(built, TooLong):
            if saving is not None:
                await saving
                await asyncio.gather(*(self.conversations.delete_message(r.conversation_id, r.turn, r.message_id)
                                       for r in rows))
            return await self._too_long(req, built)
        built_at = time.perf_counter()
        # 5. Wait for the rows, and claim the client_message_id beside them.
        placed = await self._save_claimed(req, Placed(turn, user_message, built), history, summary, saving)
        if not isinstance(placed, Placed):
            return placed  # answered by an earlier generation (nothing), or refused
        # 6. The prompt for the scheduler, and a summary request when older turns fell out of the window.
        outs = [Out(self.topics.prompts, prompt_built(req, placed), req.conversation_id)]
        outs += await self._summary(req, placed.built, summary[0] if summary else None)
        window = placed.built.window
        log.info("generation %s prompt built: turn %d, %d tokens for pool %s (window %d, reply %d), %d turns "
                 "kept, summary %s", req.generation_id, placed.turn, len(window.ids), req.pool,
                 self.max_model_len(req.pool), window.max_tokens, window.fitted.turns_kept,
                 window.fitted.summary_used)
        log.debug("generation %s prompt stage: reads %.1f ms, build %.1f ms, then writes+claim %.1f ms",
                  req.generation_id, (read_at - began) * 1000, (built_at - read_at) * 1000,
                  (time.perf_counter() - built_at) * 1000)
        return outs

    async def _drop_late(self, req: RequestAdmitted) -> list[Out]:
        # Nothing written yet; the reservation is released at once, charging nothing.
        if self.quota is not None:
            await self.quota.settle(req.generation_id, 0, 0, status="failed")
        log.info("generation %s dropped before its prompt: past its deadline by %.1f s; reservation "
                 "released, 0 tokens charged", req.generation_id, time.time() - req.deadline)
        return []

    async def _read(self, req: RequestAdmitted) -> list[Message]:
        if req.fresh_conversation and isinstance(req.history, list):
            return []  # made for this request alone: a redelivery rewrites the same user message row, no more
        if _first_message(req):
            # A page conversation's first message, through the gateway that made it, which saw no generation of
            # it before: its history is its copy of the instructions, carried sealed in the event. A redelivery
            # after the reply was saved rewrites the placeholder at its id's time, older than the reply's row.
            made = id_time(req.conversation_id) or datetime.now(UTC)
            return [instructions_message(req.conversation_id, req.instructions, made)] if req.instructions else []
        history = await self.conversations.all_messages(req.conversation_id)
        if self.finished is not None:  # a reply whose end the client saw is part of the history now
            history = await self.finished.current(history)
        return history

    async def _save_claimed(self, req: RequestAdmitted, placed: Placed, history: list[Message],
                            summary: list[Summary], saving: asyncio.Future[Any] | None) -> Placed | list[Out]:
        """The user message is saved before generation begins (before PromptBuilt is produced). The durable
        client_message_id claim runs beside those writes: it only loses to a retry the gateway's own claim
        (Redis) missed, and then the rows written here are taken back."""
        turn, user_message = placed.turn, placed.user_message
        # No claim for a regenerate (its message is saved) nor for an id made from this generation's own id.
        unclaimed = req.regenerate or req.client_message_id == own_client_message_id(req.generation_id)
        claim = None if unclaimed else asyncio.ensure_future(self.conversations.claim_client_message(
            req.conversation_id, req.client_message_id, req.generation_id, req.message_id, turn))
        await asyncio.gather(*self._writes(req, saving, len(placed.built.window.ids)))
        if claim is None:
            return placed
        won = await claim
        outcome = after_claim(req.generation_id, turn, won)
        if outcome == "ours":
            return placed
        await self._take_back(req, turn, user_message)
        if outcome == "answered":
            log.info("generation %s: client_message_id already answered by generation %s", req.generation_id,
                     won.generation_id)
            return []
        # "moved": a redelivery after a later message moved the next turn: keep the first one.
        turn, user_message = won.turn, dataclasses.replace(user_message, turn=won.turn)
        built = self._build(req, history, summary, user_message)
        if isinstance(built, TooLong):
            return await self._too_long(req, built)
        rows = self._rows(req, turn, user_message, history)
        saving = asyncio.ensure_future(self.conversations.save_messages(rows)) if rows else None
        await asyncio.gather(*self._writes(req, saving, len(built.window.ids)))
        return Placed(turn, user_message, built)

    async def _summary(self, req: RequestAdmitted, built: Built, summary: Summary | None) -> list[Out]:
        """A summary request for the turns that fell out, if the newest summary (``summary``) misses them, or
        for the block that falls next (``summaries.ahead``)."""
        window = built.window
        dropped = window.fitted.dropped_upto_turn
        if req.history is not None or dropped is None:
            return []  # before the first drop no summary is read, so none is asked for ahead either
        upto: int | None = dropped
        if not summaries.wanted(dropped, summary):
            upto = summaries.ahead(built.turns, window.fitted.turns_kept,
                                   summary.upto_turn if summary is not None else None)
        if upto is None:
            return []
        if not await self._summary_slot(req, upto):
            return []  # one summary in flight per conversation
        request = self._summary_request(req, built.turns, upto, summary)
        return [request] if request is not None else []

    async def _save_blocked(self, e: InputBlocked) -> None:
        """The refused message, kept in its conversation as ``blocked`` (the notice, not the flagged text)."""
        if e.regenerate:
            return  # the message was saved (and answered) before; only this new reply was refused
        history = await self.conversations.all_messages(e.conversation_id)
        turn = next((m.turn for m in history if m.message_id == e.message_id),  # a redelivery: same row
                    max((m.turn for m in history if m.role == "user"), default=-1) + 1)
        await self.conversations.save_message(Message(
            e.conversation_id, turn, e.message_id, "user", e.notice, status="blocked", generation_id=e.generation_id,
            client_message_id=e.client_message_id, block_category=e.block.category,
            created_at=id_time(e.message_id) or datetime.fromtimestamp(e.at, UTC), rules_version=e.block.rules_version))
        log.info("generation %s: user message saved as blocked (%s, rules %s)", e.generation_id, e.block.category,
                 e.block.rules_version)

    def _place(self, req: RequestAdmitted, history: list[Message]) -> tuple[int, Message | None]:
        return place(req, history, id_time(req.message_id) or datetime.now(UTC))  # a redelivery: the same time

    def _build(self, req: RequestAdmitted, history: list[Message], summary: list[Summary],
               user_message: Message) -> Built | TooLong:
        """The prompt for the request's pool, and for the overflow pool when its prompt would differ
        (another model's tokenizer, another window): the scheduler may still send it there."""
        turns = [] if isinstance(req.history, list) else branch_turns(history, user_message)
        told = None if isinstance(req.history, list) else instructions_in(history)  # read with the history
        window = self._fit(req, turns, summary, req.pool, told)
        if isinstance(window, TooLong):
            return window
        alternates, dropped = [], window.fitted.dropped_upto_turn is not None
        other = self.overflow_pool
        # No alternate for a pool that cannot honour the request's function calls: the scheduler then keeps it
        # on its own pool (or refuses it) rather than drop the guarantee.
        if req.pool != other and self._can_overflow(other) and self.honours(other, _tool_call(req)):
            if not self.same_model(req.pool, other) or self.max_model_len(other) != self.max_model_len(req.pool):
                alt = self._fit(req, turns, summary, other, told)
                if isinstance(alt, Window):  # no alternate: the scheduler will not overflow this one
                    alternates.append(PoolPrompt(pool=other, max_tokens=alt.max_tokens, prompt_token_ids=alt.ids))
                    dropped = dropped or alt.fitted.dropped_upto_turn is not None
            else:
                alternates.append(PoolPrompt(pool=other, max_tokens=window.max_tokens))  # same ids fit there
        return Built(window, turns, alternates, dropped)

    def _can_overflow(self, other: str) -> bool:
        try:
            self.max_model_len(other)
        except KeyError:
            return False  # no such pool in this deployment
        return True

    def _fit(self, req: RequestAdmitted, turns: list[Turn], summary: list[Summary], pool: str,
             instructions: str | None = None) -> Window | TooLong:
        tok = self.tokenizer_for_pool(pool)
        if isinstance(req.history, list):  # the client sent the whole history (OpenAI-compatible API)
            pairs = [(t.role, t.content) for t in req.history]
            return fit_window(lambda b: fit_history(pairs, tok.count, b), tok.chat_ids, self.budget,
                              self.max_model_len(pool), req.reply_cap)
        known = [(s.upto_turn, s.summary) for s in summary]
        return fit_window(lambda b: fit(turns, tok.count, b, known[0] if known else None, instructions,
                                        older=known[1] if len(known) > 1 else None),
                          tok.chat_ids, self.budget, self.max_model_len(pool), req.reply_cap)

    def _rows(self, req: RequestAdmitted, turn: int, user_message: Message, history: list[Message]) -> list[Message]:
        """What this request writes to the conversation: one statement, as the user message and the placeholder
        share a partition (a regenerate's message is saved already)."""
        rows: list[Message] = []
        if not req.regenerate and req.plan not in self.keep_nothing:
            rows.append(user_message)
        if req.plan not in self.keep_nothing and not req.fresh_conversation:
            rows += self._placeholder(req, turn, user_message.message_id, history)
        return rows

    def _writes(self, req: RequestAdmitted, saving: asyncio.Future[Any] | None,
                prompt_tokens: int) -> list[Awaitable[Any]]:
        """The rows' write (already on its way) and the reservation's true-up to the real prompt size."""
        writes: list[Awaitable[Any]] = [saving] if saving is not None else []
        if self.quota is not None:
            writes.append(self.quota.true_up(req.generation_id, prompt_tokens))  # estimate -> real prompt size
        return writes

    async def _take_back(self, req: RequestAdmitted, turn: int, user_message: Message) -> None:
        """Remove the rows this record wrote at ``turn``: another generation owns the message."""
        await asyncio.gather(self.conversations.delete_message(req.conversation_id, turn, req.generation_id),
                             self.conversations.delete_message(req.conversation_id, turn, user_message.message_id))

    @staticmethod
    def _placeholder(req: RequestAdmitted, turn: int, user_message_id: str, history: list[Message]) -> list[Message]:
        """An assistant row marked ``generating``: a reopened conversation can attach to the live reply."""
        existing = next((m for m in history if m.message_id == req.generation_id), None)
        if existing is not None and existing.status != "generating":
            return []  # already finished (this record is a redelivery): never overwrite the saved reply
        return [Message(req.conversation_id, turn, req.generation_id, "assistant", "", status="generating",
                        pool=req.pool, parent_id=user_message_id, generation_id=req.generation_id,
                        route_reason=req.route_reason, created_at=id_time(req.generation_id) or datetime.now(UTC))]

    async def _too_long(self, req: RequestAdmitted, too_long: TooLong) -> list[Out]:
        return await self._refused(req, 413, "too_long", (
            f"Your message alone is {too_long.tokens:,} tokens with the instructions; this model reads at most "
            f"{too_long.most:,} before its reply. Shorten it and send again."))

    async def _refused(self, req: RequestAdmitted, status: int, reason: Any, message: str) -> list[Out]:
        """Refuse, giving the reservation and the running slot back first, so a retry right after the
        refusal is not held up by it (and nothing is charged)."""
        if self.quota is not None:
            await self.quota.release(req.generation_id, "prompt")
        log.info("generation %s refused by the prompt build: %s (%d)", req.generation_id, reason, status)
        return [Out(self.topics.tokens, RequestRefused(
            generation_id=req.generation_id, conversation_id=req.conversation_id, user_id=req.user_id,
            reason=reason, message=message, status=status), req.generation_id)]

    async def _summary_slot(self, req: RequestAdmitted, upto: int | None) -> bool:
        if self.redis is None:
            return True
        return bool(await self.redis.set(keys.summary_requested(req.conversation_id), str(upto), nx=True,
                                         ex=summaries.IN_FLIGHT_S))

    def _summary_request(self, req: RequestAdmitted, turns: list[Turn], upto: int,
                         previous: Summary | None) -> Out | None:
        pool = self.overflow_pool  # the small pool: a summary is the service's own cheap call
        tok, context = self.tokenizer_for_pool(pool), self.max_model_len(pool)
        room = context - summaries.SUMMARY_MAX_TOKENS
        ids = tok.chat_ids(summaries.summary_messages(turns, upto, previous, tok.count, room - 64))
        if len(ids) > room:
            log.info("generation %s: turn too long to summarise (%d tokens); older turns dropped unsummarised",
                     req.generation_id, len(ids))
            return None
        return Out(self.topics.generate(pool, "free"), GenerationRequested(
            generation_id=f"{req.generation_id}:summary", conversation_id=req.conversation_id,
            user_id=req.user_id, plan=req.plan, pool=pool, lane="free", prompt_token_ids=ids,
            max_tokens=summaries.SUMMARY_MAX_TOKENS, priority=BACKGROUND_PRIORITY, turn=upto, purpose="summary",
            temperature=0.0),
            req.conversation_id)


def place(req: RequestAdmitted, history: list[Message], now: datetime) -> tuple[int, Message | None]:
    """Pure: the turn to answer and its user message (None when the message to regenerate or edit is not there).

    A new message follows the reply it names (``parent_id``; by default the newest reply) and takes the
    next turn; an edited one stands beside the message it edits, on the same turn with the same parent.
    """
    by_id = {m.message_id: m for m in history}
    if not req.regenerate and (saved := by_id.get(req.message_id)) is not None and saved.role == "user":
        return saved.turn, saved  # a redelivery: the message stays where it was first placed
    if req.regenerate:
        parent = by_id.get(req.parent_id or "")
        return (parent.turn, parent) if parent is not None and parent.role == "user" else (-1, None)
    if req.edit_of is not None:
        edited = by_id.get(req.edit_of)
        if edited is None or edited.role != "user":
            return -1, None
        turn, after = edited.turn, edited.parent_id
    else:
        prev = by_id.get(req.parent_id or "") or newest_reply(history, req.generation_id)
        after = prev.message_id if prev is not None and prev.role == "assistant" else None
        turn = prev.turn + 1 if after is not None and prev is not None else max(
            (m.turn for m in history if m.role == "user" and m.message_id != req.message_id), default=-1) + 1
    return turn, Message(req.conversation_id, turn, req.message_id, "user", req.content, status="complete",
                         parent_id=after, generation_id=req.generation_id,
                         client_message_id=req.client_message_id, created_at=now)


ClaimOutcome = Literal["ours", "answered", "moved"]


def after_claim(generation_id: str, turn: int, won: ClientMessageClaim) -> ClaimOutcome:
    """Pure: what the client_message_id claim means for this request. ``ours``: it won, carry on;
    ``answered``: another generation owns the message (take back what was written, answer nothing);
    ``moved``: this generation owns it at an earlier turn (a redelivery after a later message took the next
    turn), so the message stays on the turn first claimed."""
    if won.generation_id != generation_id:
        return "answered"
    return "moved" if won.turn != turn else "ours"


def prompt_built(req: RequestAdmitted, placed: Placed) -> PromptBuilt:
    """Pure: the event the scheduler reads, for a placed and fitted request."""
    window = placed.built.window
    return PromptBuilt(
        generation_id=req.generation_id, conversation_id=req.conversation_id, user_id=req.user_id,
        plan=req.plan, pool=req.pool, user_message_id=placed.user_message.message_id,
        assistant_message_id=req.generation_id, turn=placed.turn, prompt_token_ids=window.ids,
        max_tokens=window.max_tokens, reserved_tokens=req.reserved_tokens,
        turns_kept=window.fitted.turns_kept, summary_used=window.fitted.summary_used,
        route_reason=req.route_reason, temperature=req.temperature,
        # A request for function calls is never answered by a prepared reply (plain text, no call), and is an
        # API call's: not indexed. Otherwise the whole message: persistence indexes it without reading it back.
        question="" if _tool_call(req) else placed.user_message.content,
        sampling=req.sampling, alternates=placed.built.alternates,
        deadline=req.deadline, made_listed=req.made_listed, made_unlisted=req.made_unlisted)


def _tool_call(req: RequestAdmitted) -> str | None:
    """How the reply holds function calls (``Sampling.tool_call``), if the client asked for any."""
    return getattr(req.sampling, "tool_call", None)


def _left(saving: asyncio.Future[Any] | None) -> None:
    """A write no longer waited for: its outcome is taken when it ends (no "never retrieved" warning)."""
    if saving is not None:
        saving.add_done_callback(lambda f: f.cancelled() or f.exception())


def _first_message(req: RequestAdmitted) -> bool:
    """A message its history is carried for (``MessageSubmitted.made_unlisted``): nothing to read."""
    return (req.made_unlisted and req.history is None and not req.regenerate and req.edit_of is None
            and req.parent_id is None and id_time(req.generation_id) is not None)
