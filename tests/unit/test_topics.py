from schemas import ALL_EVENTS, EventDeadLettered
from topics import CATALOGUE, Topics
from topics.catalogue import DAY_MS, MINUTE_MS


def test_token_buffer_keeps_ten_minutes() -> None:
    tokens = next(t for t in CATALOGUE if t.name == "chat.tokens")
    assert tokens.retention_ms == 10 * MINUTE_MS


def test_request_reply_and_usage_topics_keep_a_week_or_more() -> None:
    for name in ("chat.requests", "chat.replies", "usage"):
        topic = next(t for t in CATALOGUE if t.name == name)
        assert topic.retention_ms >= 7 * DAY_MS, name


def test_every_event_has_a_topic() -> None:
    carried = {e for t in CATALOGUE for e in t.events}
    assert set(ALL_EVENTS) <= carried | {EventDeadLettered}
    assert EventDeadLettered in carried


def test_prefix_applies_to_every_name() -> None:
    names = [n for n, _ in Topics("x.").all()]
    assert names and all(n.startswith("x.") for n in names)
    assert Topics("x.").generate("large", "paid") == "x.generate.large.paid"
    assert len(set(names)) == len(CATALOGUE)


def test_generate_lanes_per_pool() -> None:
    names = {t.name for t in CATALOGUE}
    for pool in ("large", "small"):
        for lane in ("paid", "free"):
            assert f"generate.{pool}.{lane}" in names
