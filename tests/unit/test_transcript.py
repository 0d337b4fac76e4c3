"""Export and share read one branch of the tree: the newest by default, or the one ending at a named message."""
from __future__ import annotations

from datetime import UTC, datetime

from infra.stores.conversations import Message
from producers.gateway import transcript

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def msg(mid: str, role: str, turn: int, parent: str | None, content: str = "", **kw: object) -> Message:
    return Message("c1", turn, mid, role, content or mid, parent_id=parent, created_at=AT, **kw)  # type: ignore[arg-type]


# u1 -> r1a, r1b (regenerated); after r1a: u2a, and an edit u2b; u2b -> r2
TREE = [msg("01", "user", 0, None), msg("02", "assistant", 0, "01"), msg("03", "assistant", 0, "01"),
        msg("04", "user", 1, "02"), msg("05", "user", 1, "02"), msg("06", "assistant", 1, "05")]


def ids(messages: list[Message]) -> list[str]:
    return [m.message_id for m in messages]


def test_the_default_branch_is_the_newest_sibling_at_every_turn() -> None:
    # the newest reply of turn 0 (03) has no follow-up: the branch ends there, as the page shows it
    assert ids(transcript.branch(TREE)) == ["01", "03"]
    assert ids(transcript.branch(TREE[:2] + TREE[3:])) == ["01", "02", "05", "06"]


def test_a_named_last_message_picks_its_branch() -> None:
    assert ids(transcript.branch(TREE, "06")) == ["01", "02", "05", "06"]
    assert ids(transcript.branch(TREE, "04")) == ["01", "02", "04"]
    assert transcript.branch(TREE, "nope") == []


def test_messages_saved_before_users_had_parents_follow_the_newest_reply() -> None:
    legacy = [msg("01", "user", 0, None), msg("02", "assistant", 0, "01"), msg("03", "user", 1, None),
              msg("04", "assistant", 1, "03")]
    assert ids(transcript.branch(legacy)) == ["01", "02", "03", "04"]
    assert ids(transcript.branch(legacy, "04")) == ["01", "02", "03", "04"]


def test_a_looping_chain_ends() -> None:
    loop = [msg("01", "user", 0, "02"), msg("02", "assistant", 0, "01")]
    assert ids(transcript.branch(loop, "02")) == ["01", "02"]


def test_markdown_names_who_spoke_when_and_how_it_ended() -> None:
    messages = [msg("01", "user", 0, None, "Hi **there**"),
                msg("02", "assistant", 0, "01", "Hello!\n", model="SmolLM2", status="stopped")]
    text = transcript.markdown("A  title\nsplit", "large", messages, AT)
    assert text.startswith("# A title split\n")
    assert "## You · 2026-01-02T03:04:05.000Z\n\nHi **there**\n" in text
    assert "## Parley (SmolLM2) · 2026-01-02T03:04:05.000Z · stopped\n\nHello!\n" in text


def test_file_names_are_plain_ascii() -> None:
    assert transcript.filename('Über "quotes"\r\n; x', "md") == "parley-ber-quotes-x.md"
    assert transcript.filename(None, "json") == "parley-conversation.json"
