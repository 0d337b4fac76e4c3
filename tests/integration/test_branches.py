"""Edit and resend against the real Cassandra and tokenizer: an edited message is a sibling of the one it
edits, and every prompt is built from the branch being answered, never from a sibling branch."""
from __future__ import annotations

from typing import Any

import pytest

from consumers.prompt.builder import PromptBuilder
from consumers.prompt.tokenizer import tokenizer_for
from infra.config.settings import Settings
from infra.local.model import ready_pool as load_pool
from infra.stores.conversations import Conversations, Message
from infra.stores.records import Records
from schemas import PromptBuilt, RequestAdmitted, new_id
from topics import Topics


@pytest.fixture
def tok(settings: Settings) -> Any:
    model = load_pool("large", settings).model_path
    if not model.exists():
        pytest.fail(f"model folder {model} missing: run `infra/parley test` (it prepares the model)")
    return tokenizer_for(str(model))


@pytest.fixture
def builder(db: Any, settings: Settings, tok: Any) -> PromptBuilder:
    return PromptBuilder(Conversations(db), Records(db), Topics(settings.topic_prefix), lambda _: tok, 6000,
                         lambda _: 2048)


async def ask(builder: PromptBuilder, db: Any, tok: Any, cid: str, content: str, reply: str,
              **extra: Any) -> tuple[PromptBuilt, str, str]:
    """Build the prompt, then save the reply as persistence would; (prompt, its text, user message id)."""
    req = RequestAdmitted(generation_id=new_id(), conversation_id=cid, user_id="u1", plan="paid",
                          message_id=new_id(), client_message_id=new_id(), content=content, pool="large",
                          reply_cap=64, reserved_tokens=100, **extra)
    [out] = await builder.handle(req)
    built = out.event
    assert isinstance(built, PromptBuilt)
    await Conversations(db).save_message(Message(cid, built.turn, req.generation_id, "assistant", reply,
                                                 parent_id=req.message_id, generation_id=req.generation_id))
    return built, tok._tok.decode(built.prompt_token_ids), req.message_id


async def test_edits_are_siblings_and_prompts_follow_the_branch(builder: PromptBuilder, db: Any, tok: Any) -> None:
    cid = new_id()
    _, _, u0 = await ask(builder, db, tok, cid, "My name is Ada.", "Hello Ada.")
    turn1, text1, u1 = await ask(builder, db, tok, cid, "What is my name?", "Your name is Ada.")
    assert turn1.turn == 1 and "My name is Ada." in text1 and "Hello Ada." in text1

    edited, text, u1b = await ask(builder, db, tok, cid, "What is my favourite colour?", "I do not know.", edit_of=u1)
    assert edited.turn == 1 and "My name is Ada." in text and "What is my name?" not in text
    saved = {m.message_id: m for m in await Conversations(db).all_messages(cid)}
    assert saved[u1b].parent_id == saved[u1].parent_id is not None and saved[u1b].turn == saved[u1].turn
    assert saved[saved[u1].parent_id].parent_id == u0  # a user message follows a reply, which answers a message

    # Continue the edited branch, naming the reply it follows: the other branch's turn 1 is not in it.
    reply_b = next(m.message_id for m in saved.values() if m.role == "assistant" and m.parent_id == u1b)
    cont, text, _ = await ask(builder, db, tok, cid, "And my age?", "Unknown.", parent_id=reply_b)
    assert cont.turn == 2 and "favourite colour" in text and "What is my name?" not in text
    assert "Your name is Ada." not in text

    # Edit the very first message: a new root; nothing of the old conversation is in its prompt.
    root, text, _ = await ask(builder, db, tok, cid, "My name is Bob.", "Hello Bob.", edit_of=u0)
    assert root.turn == 0 and "Ada" not in text and "My name is Bob." in text

    # Naming no branch continues from the newest reply (the new root's).
    latest, text, _ = await ask(builder, db, tok, cid, "Who am I?", "Bob.")
    assert latest.turn == 1 and "Hello Bob." in text and "Ada" not in text


async def test_editing_a_missing_or_assistant_message_builds_nothing(builder: PromptBuilder, db: Any,
                                                                     tok: Any) -> None:
    cid = new_id()
    await ask(builder, db, tok, cid, "Hi.", "Hello.")
    reply = next(m for m in await Conversations(db).all_messages(cid) if m.role == "assistant")
    for target in ("nope", reply.message_id):
        req = RequestAdmitted(generation_id=new_id(), conversation_id=cid, user_id="u1", plan="paid",
                              message_id=new_id(), client_message_id=new_id(), content="x", pool="large",
                              reply_cap=64, reserved_tokens=100, edit_of=target)
        outs = await builder.handle(req)  # refused at once (404), so the client hears and nothing is held
        assert [(type(o.event).__name__, o.event.status) for o in outs] == [("RequestRefused", 404)]
    assert len(await Conversations(db).all_messages(cid)) == 2
