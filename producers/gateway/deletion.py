"""Deleting conversations from the gateway: hidden at once, data key destroyed, replies cancelled,
and ``ConversationDeleted`` on ``chat.deletions`` for the purge stage (answered after Kafka's ack)."""
from __future__ import annotations

import logging

from infra.stores.conversations import Conversation
from infra.stores.purging import mark_deleted
from producers.gateway.state import Gateway
from schemas import CancelRequested, ConversationDeleted
from schemas.deletion import DeletionReason
from topics.clients import enqueue

log = logging.getLogger(__name__)


async def delete(gw: Gateway, conv: Conversation, reason: DeletionReason = "user") -> None:
    generations = await mark_deleted(gw.conversations, gw.sealer.keys, gw.redis, conv.conversation_id,
                                     conv.user_id)
    acks = [await enqueue(gw.producer, gw.topics.control, CancelRequested(
        generation_id=g, conversation_id=conv.conversation_id, user_id=conv.user_id, reason="deleted"), key=g)
        for g in generations]
    acks.append(await enqueue(gw.producer, gw.topics.deletions, ConversationDeleted(
        conversation_id=conv.conversation_id, user_id=conv.user_id, reason=reason, generation_ids=generations),
        key=conv.conversation_id))
    for ack in acks:
        await ack
    log.info("conversation %s deleted by its owner (%s): %d generations cancelled", conv.conversation_id, reason,
             len(generations))
