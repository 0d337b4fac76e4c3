"""The prompt build's decisions, taken with no I/O: where a message goes, what the client_message_id claim
means, and the event the scheduler reads."""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from consumers.prompt.builder import Built, Placed, after_claim, place, prompt_built
from consumers.prompt.fit import Fitted, Window
from infra.stores.conversations import ClientMessageClaim, Message
from schemas import RequestAdmitted
from schemas.sampling import Sampling

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def req(**fields: Any) -> RequestAdmitted:
    base: dict[str, Any] = dict(generation_id="g2", conversation_id="c", user_id="u", plan="free", message_id="m2",
                                client_message_id="k2", content="and then?", pool="large", reply_cap=64,
                                reserved_tokens=900)
    return RequestAdmitted(**(base | fields))


def msg(turn: int, message_id: str, role: str, parent_id: str | None = None) -> Message:
    return Message("c", turn, message_id, role, "text", status="complete", parent_id=parent_id,  # type: ignore[arg-type]
                   created_at=NOW)


HISTORY = [msg(0, "m0", "user"), msg(0, "a0", "assistant", "m0"), msg(1, "m1", "user", "a0"),
           msg(1, "a1", "assistant", "m1")]


def test_a_new_message_follows_the_newest_reply_on_the_next_turn() -> None:
    turn, message = place(req(), HISTORY, NOW)
    assert turn == 2 and message is not None
    assert (message.parent_id, message.turn, message.role, message.created_at) == ("a1", 2, "user", NOW)


def test_a_message_naming_an_older_reply_branches_from_it() -> None:
    turn, message = place(req(parent_id="a0"), HISTORY, NOW)
    assert turn == 1 and message is not None and message.parent_id == "a0"


def test_an_edit_stands_beside_the_message_it_edits() -> None:
    turn, message = place(req(edit_of="m1"), HISTORY, NOW)
    assert turn == 1 and message is not None and message.parent_id == "a0"
    assert place(req(edit_of="a1"), HISTORY, NOW) == (-1, None)  # only a user message can be edited
    assert place(req(edit_of="gone"), HISTORY, NOW) == (-1, None)


def test_a_redelivered_message_stays_where_it_was_placed() -> None:
    saved = msg(1, "m2", "user", "a0")
    assert place(req(), [*HISTORY, saved], NOW) == (1, saved)


def test_a_regeneration_answers_its_parent_user_message_or_nothing() -> None:
    assert place(req(regenerate=True, parent_id="m1"), HISTORY, NOW) == (1, HISTORY[2])
    assert place(req(regenerate=True, parent_id="a1"), HISTORY, NOW) == (-1, None)


def test_the_claim_decides_between_carrying_on_answering_nothing_and_keeping_the_first_turn() -> None:
    assert after_claim("g2", 2, ClientMessageClaim("g2", "m2", 2, True)) == "ours"
    assert after_claim("g2", 2, ClientMessageClaim("g1", "m1", 2, False)) == "answered"
    assert after_claim("g2", 3, ClientMessageClaim("g2", "m2", 2, False)) == "moved"


def test_the_prompt_event_carries_the_window_and_never_a_tool_request_s_text() -> None:
    window = Window(ids=[1, 2, 3], max_tokens=64, fitted=Fitted([], turns_kept=2, dropped_upto_turn=None,
                                                                summary_used=False))
    _, message = place(req(), HISTORY, NOW)
    assert message is not None
    event = prompt_built(req(), Placed(2, message, Built(window, [], [])))
    assert (event.turn, event.prompt_token_ids, event.max_tokens, event.turns_kept) == (2, [1, 2, 3], 64, 2)
    assert (event.user_message_id, event.assistant_message_id, event.question) == ("m2", "g2", "and then?")
    tools = prompt_built(req(sampling=Sampling(tool_call="json")), Placed(2, message, Built(window, [], [])))
    assert tools.question == ""  # a prepared reply (plain text) never answers a request for function calls


class Words:
    """A tokenizer of one token per word; a rendered prompt is its messages' words and 3 per message."""

    def count(self, text: str) -> int:
        return len(text.split())

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return [0] * sum(len(m["content"].split()) + 3 for m in messages)


def test_the_conversations_instructions_reach_its_prompt_from_the_history_already_read() -> None:
    from consumers.prompt.builder import PromptBuilder
    from consumers.prompt.fit import SYSTEM_PROMPT, Window
    from infra.stores.preferences import instructions_message

    builder = PromptBuilder(None, None, None, lambda pool: Words(), 4000, lambda pool: 8192)  # type: ignore[arg-type]
    told = instructions_message("c", "Answer like a pirate.", NOW)
    turn, message = place(req(), [told, *HISTORY], NOW)
    assert turn == 2 and message is not None  # the copy is no turn of the conversation
    with_told = builder._build(req(), [told, *HISTORY], [], message)
    without = builder._build(req(), HISTORY, [], message)
    assert isinstance(with_told, Built) and isinstance(without, Built)
    system = [m["content"] for m in with_told.window.fitted.messages if m["role"] == "system"]
    assert system[0] == SYSTEM_PROMPT and system[1].endswith("Answer like a pirate.")
    assert with_told.window.fitted.messages[2:] == without.window.fitted.messages[1:]
    assert isinstance(with_told.window, Window) and len(with_told.window.ids) > len(without.window.ids)
    api = builder._build(req(history=[]), [told, *HISTORY], [], message)  # a client-sent history: not applied
    assert isinstance(api, Built) and not any("pirate" in m["content"] for m in api.window.fitted.messages)


async def test_the_rows_are_written_while_the_prompt_is_fitted_and_taken_back_if_it_cannot_fit() -> None:
    import asyncio

    from consumers.prompt.builder import PromptBuilder
    from schemas import PromptBuilt, RequestRefused
    from topics import Topics

    order: list[str] = []

    class Counting(Words):
        def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
            order.append("fit")
            return super().chat_ids(messages)

    class Convs:
        def __init__(self) -> None:
            self.rows: dict[tuple[int, str], Message] = {}
            self.deleted: list[tuple[int, str]] = []

        async def all_messages(self, conversation_id: str) -> list[Message]:
            return list(HISTORY)

        async def save_messages(self, rows: list[Message], placeholder_at_id_time: bool = False) -> None:
            order.append("write")  # the request is on its way before the prompt is fitted
            await asyncio.sleep(0.01)
            self.rows.update({(m.turn, m.message_id): m for m in rows})

        async def claim_client_message(self, cid: str, key: str, gid: str, mid: str, turn: int) -> ClientMessageClaim:
            return ClientMessageClaim(gid, mid, turn, True)

        async def delete_message(self, conversation_id: str, turn: int, message_id: str) -> None:
            self.deleted.append((turn, message_id))
            self.rows.pop((turn, message_id), None)

    convs = Convs()
    builder = PromptBuilder(convs, None, Topics("t."), lambda pool: Counting(), 4000,  # type: ignore[arg-type]
                            lambda pool: 8192)
    outs = await asyncio.wait_for(builder.handle(req()), 2)
    assert [type(o.event) for o in outs] == [PromptBuilt]
    assert set(convs.rows) == {(2, "m2"), (2, "g2")}  # the user message and the reply's placeholder
    assert order[0] == "write" and "fit" in order
    # A message that cannot fit is refused, and the rows written meanwhile are taken back.
    convs.rows.clear()
    outs = await asyncio.wait_for(builder.handle(req(generation_id="g3", message_id="m3",
                                                     content="word " * 9000)), 2)
    assert [type(o.event) for o in outs] == [RequestRefused] and outs[0].event.status == 413
    assert convs.rows == {} and sorted(convs.deleted) == [(2, "g3"), (2, "m3")]


async def test_a_first_message_carried_with_its_instructions_reads_no_history() -> None:
    from consumers.prompt.builder import PromptBuilder
    from schemas import PromptBuilt, new_id
    from topics import Topics

    class Convs:
        def __init__(self) -> None:
            self.reads = 0
            self.saved: list[tuple[list[Message], bool]] = []

        async def all_messages(self, conversation_id: str) -> list[Message]:
            self.reads += 1
            return []

        async def save_messages(self, rows: list[Message], placeholder_at_id_time: bool = False) -> None:
            self.saved.append((rows, placeholder_at_id_time))

        async def claim_client_message(self, cid: str, key: str, gid: str, mid: str, turn: int) -> ClientMessageClaim:
            return ClientMessageClaim(gid, mid, turn, True)

    convs = Convs()
    builder = PromptBuilder(convs, None, Topics("t."), lambda pool: Words(), 4000,  # type: ignore[arg-type]
                            lambda pool: 8192)
    first = req(generation_id=new_id(), conversation_id=new_id(), made_unlisted=True,
                instructions="Answer like a pirate.")
    [out] = await builder.handle(first)
    assert convs.reads == 0 and isinstance(out.event, PromptBuilt) and out.event.turn == 0
    [(rows, at_id_time)] = convs.saved
    # The user message and the placeholder, the placeholder written as of its id's time: a redelivery that did
    # not read the saved reply cannot overwrite it.
    assert [(m.role, m.turn) for m in rows] == [("user", 0), ("assistant", 0)] and at_id_time
    plain = await PromptBuilder(Convs(), None, Topics("t."), lambda pool: Words(), 4000,  # type: ignore[arg-type]
                                lambda pool: 8192).handle(req(generation_id=new_id(), conversation_id=new_id()))
    assert len(out.event.prompt_token_ids) > len(plain[0].event.prompt_token_ids)  # the instructions are in it
    # Not a first message (a regenerate, a branch, no time in its id): the history is read.
    for other in (dict(regenerate=True, parent_id="m0"), dict(parent_id="a0"), dict(generation_id="g9")):
        convs.reads = 0
        await builder.handle(req(**(dict(generation_id=new_id(), made_unlisted=True) | other)))
        assert convs.reads == 1, other
