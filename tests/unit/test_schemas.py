import msgspec
import pytest

from schemas import (
    ALL_EVENTS,
    GenerationFinished,
    MalformedEvent,
    MessageSubmitted,
    TokensAppended,
    UnsupportedVersion,
    Usage,
    decode,
    encode,
    id_time_ms,
    new_id,
)
from schemas.jsonschema import OUT_DIR, render


def _submitted(**kw: object) -> MessageSubmitted:
    base = dict(generation_id=new_id(), conversation_id="c1", user_id="u1", plan="free", message_id="m1",
                client_message_id="cm1", content="hello")
    base.update(kw)
    return MessageSubmitted(**base)  # type: ignore[arg-type]


def test_round_trip_keeps_type_and_fields() -> None:
    event = _submitted(pool="small")
    back = decode(encode(event))
    assert back == event and isinstance(back, MessageSubmitted)


def test_decoding_restricted_to_a_topics_types() -> None:
    tokens = TokensAppended(generation_id="g", conversation_id="c", user_id="u", seq=0, text="a", token_ids=[1])
    assert decode(encode(tokens), (TokensAppended, GenerationFinished)) == tokens
    with pytest.raises(MalformedEvent):
        decode(encode(_submitted()), (TokensAppended,))


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b'{"type":"Nope","v":1}', b'{"type":"MessageSubmitted"}'])
def test_malformed_records_raise_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedEvent):
        decode(raw)


def test_unknown_version_raises_unsupported() -> None:
    raw = encode(_submitted()).replace(b'"v":1', b'"v":7')
    with pytest.raises(UnsupportedVersion) as info:
        decode(raw)
    assert info.value.version == 7 and info.value.type_name == "MessageSubmitted"


def test_events_are_frozen() -> None:
    event = _submitted()
    with pytest.raises(AttributeError):
        event.content = "changed"  # type: ignore[misc]


def test_every_event_carries_the_ids_a_trace_needs() -> None:
    for cls in ALL_EVENTS:
        names = {f.name for f in msgspec.structs.fields(cls)}
        if cls.__name__ == "EventDeadLettered":
            continue  # wraps an unreadable record: it has no ids to carry
        if cls.__name__.startswith("Conversation"):  # about a whole conversation, not one generation
            assert {"conversation_id", "user_id", "at"} <= names, cls.__name__
            continue
        assert {"generation_id", "conversation_id", "user_id", "at"} <= names, cls.__name__


def test_ids_are_time_ordered() -> None:
    first, second = new_id(), new_id()
    assert id_time_ms(first) <= id_time_ms(second)
    ids = [new_id() for _ in range(500)]  # many share a millisecond
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [id_time_ms(i) for i in ids] == sorted(id_time_ms(i) for i in ids)


def test_usage_defaults_to_zero() -> None:
    assert Usage() == Usage(prompt_tokens=0, completion_tokens=0, cached_prompt_tokens=0)


def test_committed_json_schemas_are_current() -> None:
    """Fails when an event class changed and ``python -m schemas.jsonschema`` was not re-run."""
    rendered = render()
    committed = {p.name: p.read_text() for p in OUT_DIR.glob("*.json")}
    assert set(committed) == set(rendered), "run: python -m schemas.jsonschema"
    stale = [name for name, text in rendered.items() if committed[name] != text]
    assert not stale, f"stale JSON Schemas {stale}; run: python -m schemas.jsonschema"
