"""Lean token records: text, token ids and logprobs sealed together once, no field at its default written,
and records sealed field by field (written before) still open."""
from __future__ import annotations

import msgspec
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from infra.stores.crypto import KeyGone
from infra.stores.sealing import Sealer, is_sealed, seal_bytes
from schemas import TokensAppended, decode, encode, keyless, new_id
from schemas.sampling import TokenLogprob, TopLogprob


class Keys:
    def __init__(self) -> None:
        self.key, self.gone = AESGCM(AESGCM.generate_key(bit_length=256)), False

    async def get(self, conversation_id: str) -> AESGCM:
        if self.gone:
            raise KeyGone(conversation_id)
        return self.key


def record(tokens: int, logprobs: bool = False, **more: object) -> TokensAppended:
    return TokensAppended(generation_id=new_id(), conversation_id=new_id(), seq=7, text=" word" * tokens,
                          token_ids=[1234 + i for i in range(tokens)], epoch=2, **more,  # type: ignore[arg-type]
                          logprobs=[TokenLogprob(" word", -0.25, [TopLogprob(" w", -1.5)])] * tokens if logprobs
                          else None)


@pytest.mark.parametrize("logprobs", [False, True])
async def test_one_seal_carries_text_ids_and_logprobs_and_opens_to_the_same_event(logprobs: bool) -> None:
    sealer, plain = Sealer(Keys()), record(3, logprobs)  # type: ignore[arg-type]
    sealed = await sealer.seal(plain)
    assert is_sealed(sealed.sealed) and (sealed.text, sealed.token_ids, sealed.logprobs) == ("", [], None)
    wire = encode(sealed)
    assert b" word" not in wire and b"1234" not in wire  # nothing of the reply in clear
    assert await sealer.open(decode(wire)) == plain
    assert await sealer.seal(sealed) == sealed  # sealing twice is sealing once


async def test_a_record_leaves_out_what_is_at_its_default_and_is_smaller_than_field_by_field() -> None:
    keys = Keys()
    sealer, plain = Sealer(keys), record(3)  # type: ignore[arg-type]
    wire = keyless(await sealer.seal(plain))  # as the worker writes it, keyed by the generation id
    assert set(msgspec.json.decode(wire)) == {"type", "conversation_id", "seq", "epoch", "sealed"}
    assert await sealer.open(decode(wire, key=plain.generation_id.encode())) == plain  # the key fills it in
    assert decode(wire).generation_id == ""  # a reader that does not pass the key cannot route it
    assert decode(encode(plain), key=b"another").generation_id == plain.generation_id  # a written id wins
    # as records were written before: a user id, text and token ids each sealed on its own
    cid = plain.conversation_id
    old = msgspec.structs.replace(plain, user_id=new_id(),
                                  text=seal_bytes(keys.key, cid, plain.text.encode()),
                                  token_ids=seal_bytes(keys.key, cid, b"".join(i.to_bytes(4, "little")
                                                                              for i in plain.token_ids)))
    assert len(encode(await sealer.seal(plain))) < len(encode(old)) - 100
    assert await sealer.open(decode(encode(old))) == msgspec.structs.replace(plain, user_id=old.user_id)


async def test_an_unsealed_record_reads_as_it_was_written_and_a_deleted_conversations_does_not_open() -> None:
    keys = Keys()
    sealer, plain = Sealer(keys), record(1)  # type: ignore[arg-type]
    assert decode(encode(plain)) == plain  # sealing off: the fields travel as they are
    sealed = await sealer.seal(plain)
    keys.gone = True
    with pytest.raises(KeyGone):
        await sealer.open(sealed)
    empty = record(0)
    assert await sealer.seal(empty) == empty  # nothing to seal (an end-of-sequence step with no ids)


def test_a_token_records_time_is_its_kafka_timestamp_and_a_written_time_wins() -> None:
    from types import SimpleNamespace

    from schemas import decode_record

    plain = record(2, at=1_790_000_123.25)
    wire = keyless(plain)
    assert b"1790000123" not in wire and "at" not in msgspec.json.decode(wire)  # the record's timestamp gives it
    kafka = SimpleNamespace(value=wire, key=plain.generation_id.encode(), timestamp=1_790_000_124_500)
    read = decode_record(kafka)
    assert (read.generation_id, read.at) == (plain.generation_id, 1_790_000_124.5)
    written = SimpleNamespace(value=encode(plain), key=b"k", timestamp=1_790_000_124_500)
    assert decode_record(written).at == 1_790_000_123.25  # records written before carry their own
