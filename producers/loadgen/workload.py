"""What each arrival sends: a new conversation or the next turn of an idle one, from a paid or a free user.

The seeds' prompt is ~1,800 tokens (a 6,000-token budget) and the reply ~640: a conversation of up to
``max_turns`` turns whose user messages are ~``message_tokens`` long grows its prompt by a message and a reply
per turn (about 330, 1,270, 2,210, 3,150 tokens over four turns: ~1,750 on average). A follow-up posts to the
same conversation, so the prompt stage loads its history and the engine may find its prefix cached. Pure: the
choices come from a seeded ``random.Random``; the HTTP side lives in ``client``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

# Plain words (no markup, nothing a content rule could flag); ~0.75 words per token with SmolLM2's tokenizer.
WORDS = ("the river town market bread morning window garden letter travel engine quiet summer winter story "
         "friend music paper light stone harbor bridge train village mountain forest kitchen table question "
         "answer history science planet ocean island library teacher student road night city field lamp "
         "clock season weather journey evening coffee program number careful simple bright early").split()
WORDS_PER_TOKEN = 0.75


@dataclass(frozen=True)
class User:
    user_id: str
    token: str
    plan: str


@dataclass
class Conversation:
    index: int
    user: User
    conversation_id: str | None = None  # None until created on the service
    turns: int = 0  # turns sent so far
    busy: bool = False


@dataclass(frozen=True)
class Turn:
    conversation: Conversation
    number: int  # 0 for a new conversation
    content: str


@dataclass
class Workload:
    users: list[User]
    rng: random.Random
    max_turns: int = 4
    follow_share: float = 0.6  # of arrivals, when an idle conversation can take one
    message_tokens: int = 300
    conversations: list[Conversation] = field(default_factory=list)

    def next_turn(self) -> Turn:
        """The arrival's turn: the next of an idle, unfinished conversation, or the first of a new one."""
        idle = [c for c in self.conversations if not c.busy and c.turns < self.max_turns]
        if idle and self.rng.random() < self.follow_share:
            conv = self.rng.choice(idle)
        else:
            conv = Conversation(len(self.conversations), self.users[len(self.conversations) % len(self.users)])
            self.conversations.append(conv)
        conv.busy = True
        return Turn(conv, conv.turns, message_text(self.rng, self.message_tokens, conv.index, conv.turns))

    def finished(self, turn: Turn) -> None:
        """The reply to ``turn`` ended (or failed): its conversation may take the next turn."""
        turn.conversation.turns += 1
        turn.conversation.busy = False


def message_text(rng: random.Random, tokens: int, conversation: int, turn: int) -> str:
    """About ``tokens`` tokens of plain words, different for every conversation and turn."""
    n = max(1, int(tokens * WORDS_PER_TOKEN))
    body = " ".join(rng.choice(WORDS) for _ in range(n))
    return f"Conversation {conversation}, turn {turn}: please write a long answer about this. {body}"


def mix_users(paid: list[User], free: list[User]) -> list[User]:
    """Paid and free users interleaved in proportion, so any prefix of conversations has the same mix."""
    keyed = [((k + 0.5) / len(group), u) for group in (paid, free) for k, u in enumerate(group)]
    return [u for _, u in sorted(keyed, key=lambda pair: pair[0])]
